"""The command line (`python main.py <command>`). Never imports Qt."""
