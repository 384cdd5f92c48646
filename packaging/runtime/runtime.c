// The app's AppImage runtime (type 2): this ELF file, then a SquashFS image of the AppDir
// appended to it. Run, it runs the AppDir's AppRun with the arguments given:
//   - from a copy extracted once into the user's cache folder ($XDG_CACHE_HOME/voicestudio/
//     appimage/: one image's copy at a time, another image's removed once the new one is
//     complete; a copy being made is used only once complete). A start from the copy reads its
//     files through the page cache like any installed program's; a start from a FUSE mount
//     decompresses every library it loads again, as each mount is a new file system.
//   - with APPIMAGE_MOUNT=1 or --appimage-mount, from the image itself, mounted read-only
//     through FUSE (squashfuse's low-level operations, linked in) at a folder of $TMPDIR removed
//     again at exit; where FUSE cannot mount it (no /dev/fuse or no right to mount, as in a
//     container), from the copy.
// --appimage-extract [FOLDER] extracts the AppDir into squashfs-root (or FOLDER);
// --appimage-offset prints where the image starts. AppRun gets APPIMAGE (this file), APPDIR
// (where the AppDir is), ARGV0 and OWD (the folder it was started from).
#define _GNU_SOURCE
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <squashfuse/ll.h>
#include <squashfuse/traverse.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char self[PATH_MAX];

static void die(const char * what) {
    fprintf(stderr, "AppImage runtime: %s: %s\n", what, errno ? strerror(errno) : "failed");
    exit(127);
}

// Where the image starts: the end of this ELF file (its section headers come last).
static off_t image_offset(void) {
    Elf64_Ehdr h;
    int        fd = open(self, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || pread(fd, &h, sizeof h, 0) != (ssize_t) sizeof h || memcmp(h.e_ident, ELFMAG, SELFMAG) != 0 ||
        h.e_ident[EI_CLASS] != ELFCLASS64) {
        die("this file is not a 64-bit ELF runtime");
    }
    close(fd);
    return (off_t) (h.e_shoff + (Elf64_Off) h.e_shentsize * h.e_shnum);
}

// snprintf into a path buffer; a path too long for it ends the run.
#define FORMAT(buf, ...)                                                  \
    do {                                                                  \
        if (snprintf(buf, sizeof buf, __VA_ARGS__) >= (int) sizeof buf) { \
            errno = ENAMETOOLONG;                                         \
            die(buf);                                                     \
        }                                                                 \
    } while (0)

static int mkdirs(const char * path, mode_t mode) {
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int) sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char * p = buf + 1; *p; ++p) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, mode) != 0 && errno != EEXIST) {
                return -1;
            }
            *p = '/';
        }
    }
    return mkdir(buf, mode) != 0 && errno != EEXIST ? -1 : 0;
}

// The AppDir of the image into `dest` (made), its files' modes kept.
static int extract(sqfs * fs, const char * dest) {
    static char   data[1 << 16];
    sqfs_traverse trv;
    sqfs_err      err = SQFS_OK;
    char          path[PATH_MAX];
    if (mkdirs(dest, 0755) != 0 || sqfs_traverse_open(&trv, fs, sqfs_inode_root(fs)) != SQFS_OK) {
        return -1;
    }
    while (sqfs_traverse_next(&trv, &err)) {
        sqfs_inode inode;
        if (trv.dir_end) {
            continue;
        }
        if (snprintf(path, sizeof path, "%s/%s", dest, trv.path) >= (int) sizeof path ||
            sqfs_inode_get(fs, &inode, sqfs_dentry_inode(&trv.entry)) != SQFS_OK) {
            err = SQFS_ERR;
            break;
        }
        const mode_t mode = inode.base.mode;
        if (S_ISDIR(mode)) {
            if (mkdir(path, (mode & 07777) | 0700) != 0 && errno != EEXIST) {
                err = SQFS_ERR;
                break;
            }
        } else if (S_ISLNK(mode)) {
            char   target[PATH_MAX];
            size_t size = sizeof target;
            if (sqfs_readlink(fs, &inode, target, &size) != SQFS_OK || symlink(target, path) != 0) {
                err = SQFS_ERR;
                break;
            }
        } else if (S_ISREG(mode)) {
            int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, (mode & 0777) | 0600);
            if (fd < 0) {
                err = SQFS_ERR;
                break;
            }
            for (sqfs_off_t at = 0; at < (sqfs_off_t) inode.xtra.reg.file_size;) {
                sqfs_off_t n = sizeof data;
                if (sqfs_read_range(fs, &inode, at, &n, data) != SQFS_OK || n <= 0 ||
                    write(fd, data, (size_t) n) != (ssize_t) n) {
                    err = SQFS_ERR;
                    break;
                }
                at += n;
            }
            if (close(fd) != 0 || err != SQFS_OK) {
                err = SQFS_ERR;
                break;
            }
        }
    }
    sqfs_traverse_close(&trv);
    return err == SQFS_OK ? 0 : -1;
}

static int remove_tree(const char * path) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        return errno == ENOENT ? 0 : -1;
    }
    if (S_ISDIR(st.st_mode)) {
        chmod(path, 0700);
        DIR * d = opendir(path);
        if (!d) {
            return -1;
        }
        for (struct dirent * e; (e = readdir(d));) {
            char sub[PATH_MAX];
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) {
                continue;
            }
            FORMAT(sub, "%s/%s", path, e->d_name);
            remove_tree(sub);
        }
        closedir(d);
        return rmdir(path);
    }
    return unlink(path);
}

// AppRun of `appdir` with argv's arguments: in place of this process (`stay` false), or in a child
// that this process waits for, passing Ctrl-C and the like to it alone (`stay`: the FUSE mount
// must outlive the app), its exit status returned.
static int run_apprun(const char * appdir, char ** argv, bool stay) {
    char apprun[PATH_MAX], owd[PATH_MAX];
    FORMAT(apprun, "%s/AppRun", appdir);
    setenv("APPIMAGE", self, 1);
    setenv("APPDIR", appdir, 1);
    setenv("ARGV0", argv[0], 1);
    if (getcwd(owd, sizeof owd)) {
        setenv("OWD", owd, 1);
    }
    pid_t pid = stay ? fork() : 0;
    if (pid == 0) {
        argv[0] = apprun;
        execv(apprun, argv);
        die(apprun);
    }
    if (pid < 0) {
        die("fork");
    }
    signal(SIGINT, SIG_IGN);  // the app's to handle; the mount is taken down after it exits
    signal(SIGQUIT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The extracted copy in the user's cache (made first where missing), then AppRun from it.
static int extract_and_run(sqfs * fs, char ** argv) {
    char        base[PATH_MAX], dest[PATH_MAX], part[PATH_MAX], apprun[PATH_MAX];
    const char *cache = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (cache && *cache) {
        FORMAT(base, "%s/voicestudio/appimage", cache);
    } else if (home && *home) {
        FORMAT(base, "%s/.cache/voicestudio/appimage", home);
    } else {
        errno = ENOENT;
        die("no cache folder ($XDG_CACHE_HOME and $HOME are unset)");
    }
    FORMAT(dest, "%s/%llx-%llx", base, (unsigned long long) fs->sb.bytes_used, (unsigned long long) fs->sb.mkfs_time);
    FORMAT(apprun, "%s/AppRun", dest);
    if (access(apprun, X_OK) != 0) {
        FORMAT(part, "%s.part-%d", dest, (int) getpid());
        if (mkdirs(base, 0700) != 0 || extract(fs, part) != 0) {
            remove_tree(part);
            die("extracting the app into the cache folder");
        }
        if (rename(part, dest) != 0) {  // another start made it meanwhile: use that one
            remove_tree(part);
        }
        DIR * d = opendir(base);  // earlier images' copies (a finished one each)
        for (struct dirent * e; d && (e = readdir(d));) {
            char old[PATH_MAX];
            FORMAT(old, "%s/%s", base, e->d_name);
            const char * pid = strstr(e->d_name, ".part-");  // a copy being made, or left by a start killed
            if (e->d_name[0] != '.' && strcmp(old, dest) != 0 &&
                (!pid || (kill((pid_t) atoi(pid + 6), 0) != 0 && errno == ESRCH))) {
                remove_tree(old);
            }
        }
        if (d) {
            closedir(d);
        }
    }
    return run_apprun(dest, argv, false);
}

// The image mounted at a new folder of $TMPDIR by a child serving it; AppRun from there;
// then unmounted and the folder removed. -1 where FUSE could not mount it.
static int mount_and_run(off_t offset, char ** argv) {
    if (access("/dev/fuse", R_OK | W_OK) != 0) {
        return -1;
    }
    const char * tmp = getenv("TMPDIR");
    char         mnt[PATH_MAX];
    FORMAT(mnt, "%s/.mount_voicestudio_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(mnt)) {
        return -1;
    }
    int ready[2];
    if (pipe2(ready, O_CLOEXEC) != 0) {
        rmdir(mnt);
        return -1;
    }
    const pid_t parent = getpid();
    pid_t       server = fork();
    if (server == 0) {
        close(ready[0]);
        prctl(PR_SET_PDEATHSIG, SIGTERM);  // the runtime gone: the mount goes too
        if (getppid() != parent) {
            _exit(1);
        }
        char                     ok  = 0;
        sqfs_ll *                ll  = sqfs_ll_open(self, (size_t) offset);
        struct fuse_args         fa  = FUSE_ARGS_INIT(0, NULL);
        struct fuse_lowlevel_ops ops = { 0 };
        ops.getattr                  = sqfs_ll_op_getattr;
        ops.opendir                  = sqfs_ll_op_opendir;
        ops.releasedir               = sqfs_ll_op_releasedir;
        ops.readdir                  = sqfs_ll_op_readdir;
        ops.lookup                   = sqfs_ll_op_lookup;
        ops.listxattr                = sqfs_ll_op_listxattr;
        ops.getxattr                 = sqfs_ll_op_getxattr;
        ops.forget                   = sqfs_ll_op_forget;
        ops.statfs                   = stfs_ll_op_statfs;
        ops.create                   = sqfs_ll_op_create;
        ops.open                     = sqfs_ll_op_open;
        ops.release                  = sqfs_ll_op_release;
        ops.read                     = sqfs_ll_op_read;
        ops.readlink                 = sqfs_ll_op_readlink;
        sqfs_ll_chan ch;
        if (!ll || fuse_opt_add_arg(&fa, "voicestudio") != 0 || fuse_opt_add_arg(&fa, "-oro,nodev,nosuid") != 0 ||
            sqfs_ll_mount(&ch, mnt, &fa, &ops, sizeof ops, ll) != SQFS_OK) {
            if (write(ready[1], &ok, 1) < 0) {
                _exit(1);
            }
            _exit(1);
        }
        fuse_set_signal_handlers(ch.session);
        ok = 1;
        if (write(ready[1], &ok, 1) < 0) {
            _exit(1);
        }
        close(ready[1]);
        fuse_session_loop(ch.session);
        sqfs_ll_unmount(&ch, mnt);
        _exit(0);
    }
    close(ready[1]);
    char ok = 0;
    if (server < 0 || read(ready[0], &ok, 1) != 1 || !ok) {
        close(ready[0]);
        if (server > 0) {
            waitpid(server, NULL, 0);
        }
        rmdir(mnt);
        return -1;
    }
    close(ready[0]);
    const int code = run_apprun(mnt, argv, true);
    kill(server, SIGTERM);  // fuse_session_loop returns; the server unmounts
    waitpid(server, NULL, 0);
    rmdir(mnt);
    return code;
}

int main(int argc, char ** argv) {
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        die("cannot find this file (/proc/self/exe)");
    }
    self[n]            = 0;
    const off_t offset = image_offset();
    const char *flag = argc > 1 ? argv[1] : "", *env = getenv("APPIMAGE_MOUNT");
    if (strcmp(flag, "--appimage-offset") == 0) {
        printf("%lld\n", (long long) offset);
        return 0;
    }
    int  fd = open(self, O_RDONLY | O_CLOEXEC);
    sqfs fs;
    if (fd < 0 || sqfs_init(&fs, fd, (size_t) offset) != SQFS_OK) {
        errno = 0;
        die("this file holds no readable SquashFS image after its runtime");
    }
    if (strcmp(flag, "--appimage-extract") == 0) {
        const char * dest = argc > 2 ? argv[2] : "squashfs-root";
        if (extract(&fs, dest) != 0) {
            die("extracting");
        }
        printf("%s\n", dest);
        return 0;
    }
    if (strcmp(flag, "--appimage-extract-and-run") == 0 || strcmp(flag, "--appimage-mount") == 0) {
        argv[1] = argv[0];
        ++argv;
    }
    if (strcmp(flag, "--appimage-mount") == 0 || (env && strcmp(env, "1") == 0)) {
        const int code = mount_and_run(offset, argv);
        if (code >= 0) {
            return code;
        }
        fprintf(stderr, "AppImage runtime: FUSE could not mount the image; running its extracted copy\n");
    }
    return extract_and_run(&fs, argv);
}
