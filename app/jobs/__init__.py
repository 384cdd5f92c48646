"""Work off the GUI thread: QRunnable jobs that open engines, synthesize and make profiles."""
