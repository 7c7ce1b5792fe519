/*
 * mtgpu-jobinit: the last steps of a job's start, between its supervisor and its script.
 *
 * The supervisor (supervisor.py) starts this with posix_spawn, which on Linux is a
 * vfork: the supervisor's memory is not copied, as a fork of a Python process copies
 * its page tables and then a page for every object either side touches. This program
 * does what the supervisor's forked child does otherwise, in the same order and with
 * the same messages, then execs the job:
 *
 *   name the process; oom_score_adj 0; the job's nice value; join the job's cgroups; pin the CPUs;
 *   become the tenant (groups, gid, uid); setsid; the umask and resource limits of the
 *   submitting shell (bounded by the hard limits inherited here); chdir to the working
 *   directory; open the output files as the tenant (making the default directory);
 *   standard input from /dev/null; exec the job.
 *
 * Usage (all arguments required, in this order; an empty string for "none"):
 *
 *   mtgpu-jobinit PROCESS_NAME NICE USER REPORT_FD UID GID GROUPS CPUS WORKDIR STDOUT
 *                 STDERR DEFAULT_DIR ENV_FD UMASK RLIMITS OPEN_MODE CGROUP_PROCS... -- ARGV...
 *
 *   NICE           the job's nice value (its supervisor runs nicer)
 *
 *   GROUPS, CPUS   comma-separated numbers
 *   DEFAULT_DIR    the default output directory to create (mode 0700), or ""
 *   ENV_FD         a file holding the job's environment, NAME=VALUE entries each ended
 *                  by a NUL byte, read from its start
 *   UMASK          the job's umask in octal ("" for 022)
 *   RLIMITS        NAME=SOFT:HARD,... (Slurm's limit names, lower case; -1 unlimited),
 *                  set once the job is the tenant, each within the hard limit it has
 *   OPEN_MODE      "append" or "truncate": how the output files are opened (--open-mode)
 *   CGROUP_PROCS   each cgroup's cgroup.procs file
 *
 * This program runs as root until it becomes the tenant, so its own environment is
 * empty: the job's (which the tenant chose in part) reaches only the exec'd job. A
 * dynamic-loader or Python variable in its own environment (LD_*, PYTHON*) means it
 * was not started by a supervisor: it refuses to go on. On failure, "STAGE: REASON" goes to REPORT_FD and the
 * exit status is 127; on success REPORT_FD is closed by the exec (it is set
 * close-on-exec here), which tells the supervisor that the job runs.
 *
 * Build: cc -O2 -o mtgpu-jobinit jobinit.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

extern char **environ;

static int report_fd = -1;
static char stage[4200];

static void set_stage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(stage, sizeof stage, fmt, ap);
    va_end(ap);
}

/* Report "STAGE: TEXT" to the supervisor and exit 127. */
static void die_msg(const char *text) {
    char msg[8600];
    int n = snprintf(msg, sizeof msg, "%s: %s", stage, text);
    if (n > 4000)
        n = 4000;
    if (report_fd >= 0 && n > 0) {
        ssize_t w = write(report_fd, msg, (size_t)n);
        (void)w;
    }
    _exit(127);
}

/* As the Python supervisor words an OSError: "STAGE: strerror[: path]", the path
 * left out when the stage names it already (the output file, say). */
static void die(const char *path) {
    char text[4200];
    if (path && strstr(stage, path))
        path = NULL;
    snprintf(text, sizeof text, "%s%s%s", strerror(errno), path ? ": " : "", path ? path : "");
    die_msg(text);
}

static int write_file(const char *path, const char *value) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, value, strlen(value));
    int saved = errno;
    close(fd);
    errno = saved;
    return n == (ssize_t)strlen(value) ? 0 : -1;
}

/* Parse "1,2,3" into out (at most max); returns the count, or -1 on bad input. */
static int numbers(const char *s, long *out, int max) {
    int n = 0;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || n >= max)
            return -1;
        out[n++] = v;
        s = end;
        if (*s == ',')
            s++;
        else if (*s)
            return -1;
    }
    return n;
}

static int mkdirs(const char *path, mode_t mode) {
    char tmp[4096];
    if (strlen(path) >= sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(tmp, path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, mode) < 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(tmp, mode) < 0 && errno != EEXIST)
        return -1;
    return 0;
}

/* The NUL-separated NAME=VALUE entries in fd (at most 16 MiB), as an environ array. */
static char **read_env(int fd) {
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap + 1);
    if (buf == NULL || lseek(fd, 0, SEEK_SET) < 0)
        return NULL;
    for (;;) {
        if (len == cap) {
            if (cap >= (16u << 20)) {
                errno = E2BIG;
                return NULL;
            }
            cap *= 2;
            char *bigger = realloc(buf, cap + 1);
            if (bigger == NULL)
                return NULL;
            buf = bigger;
        }
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return NULL;
        if (n == 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    size_t count = 0;
    for (size_t k = 0; k < len; k++)
        if (buf[k] == '\0')
            count++;
    char **env = calloc(count + 2, sizeof *env);
    if (env == NULL)
        return NULL;
    size_t e = 0;
    for (size_t k = 0; k < len; k += strlen(buf + k) + 1)
        if (buf[k])
            env[e++] = buf + k;
    env[e] = NULL;
    return env;
}

/* RLIMITS: "nofile=1024:4096,stack=-1:-1"; each is held within the hard limit this
 * process has (as the tenant it cannot raise one). 0, or -1 with errno set. */
static int set_limits(const char *spec) {
    static const struct {
        const char *name;
        int res;
    } names[] = {{"as", RLIMIT_AS},         {"core", RLIMIT_CORE},       {"cpu", RLIMIT_CPU},
                 {"data", RLIMIT_DATA},     {"fsize", RLIMIT_FSIZE},     {"memlock", RLIMIT_MEMLOCK},
                 {"nofile", RLIMIT_NOFILE}, {"nproc", RLIMIT_NPROC},     {"rss", RLIMIT_RSS},
                 {"stack", RLIMIT_STACK}};
    const char *p = spec;
    while (*p) {
        char name[16];
        long long soft, hard;
        int n = 0;
        if (sscanf(p, "%15[a-z]=%lld:%lld%n", name, &soft, &hard, &n) != 3 || n == 0) {
            errno = EINVAL;
            return -1;
        }
        p += n;
        if (*p == ',')
            p++;
        int res = -1;
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
            if (strcmp(names[k].name, name) == 0)
                res = names[k].res;
        if (res < 0)
            continue;
        struct rlimit cur;
        if (getrlimit(res, &cur) < 0)
            return -1;
        rlim_t h = hard < 0 ? RLIM_INFINITY : (rlim_t)hard;
        rlim_t s = soft < 0 ? RLIM_INFINITY : (rlim_t)soft;
        if (cur.rlim_max != RLIM_INFINITY && (h == RLIM_INFINITY || h > cur.rlim_max))
            h = cur.rlim_max;
        if (h != RLIM_INFINITY && (s == RLIM_INFINITY || s > h))
            s = h;
        struct rlimit want = {s, h};
        if (setrlimit(res, &want) < 0)
            return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    report_fd = argc > 4 ? atoi(argv[4]) : -1;
    for (char **e = environ; *e; e++)
        if (strncmp(*e, "LD_", 3) == 0 || strncmp(*e, "PYTHON", 6) == 0) {
            char text[256];
            snprintf(text, sizeof text, "refusing to start with %.*s in the environment",
                     (int)strcspn(*e, "="), *e);
            set_stage("setting up");
            die_msg(text);
        }
    if (argc < 19) {
        fputs("mtgpu-jobinit is started by an MTGPU job supervisor, not by hand\n", stderr);
        return 2;
    }
    const char *proc_name = argv[1], *user = argv[3];
    int nice_value = atoi(argv[2]);
    report_fd = atoi(argv[4]);
    if (report_fd >= 0)
        fcntl(report_fd, F_SETFD, FD_CLOEXEC);
    uid_t uid = (uid_t)strtoul(argv[5], NULL, 10);
    gid_t gid = (gid_t)strtoul(argv[6], NULL, 10);
    const char *groups_s = argv[7], *cpus_s = argv[8], *workdir = argv[9];
    const char *out = argv[10], *err = argv[11], *default_dir = argv[12];
    int env_fd = atoi(argv[13]);
    const char *umask_s = argv[14], *rlimits_s = argv[15];
    int append = strcmp(argv[16], "append") == 0;
    int i = 17;
    char **cgroups = argv + i;
    int n_cgroups = 0;
    while (i < argc && strcmp(argv[i], "--") != 0)
        i++, n_cgroups++;
    if (i >= argc - 1) {
        set_stage("setting up");
        die_msg("no command after --");
    }
    char **job = argv + i + 1;

    set_stage("reading the job's environment");
    char **job_env = read_env(env_fd);
    if (job_env == NULL)
        die(NULL);

    set_stage("setting up");
    prctl(PR_SET_NAME, proc_name, 0, 0, 0);
    (void)write_file("/proc/self/oom_score_adj", "0"); /* the job must not inherit our protection */
    if (setpriority(PRIO_PROCESS, 0, nice_value) < 0) /* nor the supervisor's lower priority */
        die(NULL);

    set_stage("joining the job's cgroups");
    for (int c = 0; c < n_cgroups; c++)
        if (write_file(cgroups[c], "0") < 0)
            die(cgroups[c]);

    long cpus[1024];
    int n_cpus = numbers(cpus_s, cpus, 1024);
    char shown[8192] = ""; /* as Python shows the list: [0, 1] */
    for (int c = 0, len = 0; c < n_cpus && len < (int)sizeof shown - 32; c++)
        len += snprintf(shown + len, sizeof shown - (size_t)len, "%s%ld", c ? ", " : "", cpus[c]);
    if (n_cpus > 0) {
        set_stage("pinning the job to CPUs [%s]", shown);
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int c = 0; c < n_cpus; c++)
            if (cpus[c] < CPU_SETSIZE)
                CPU_SET(cpus[c], &set);
        if (sched_setaffinity(0, sizeof set, &set) < 0)
            die(NULL);
    } else if (n_cpus < 0) {
        set_stage("pinning the job to CPUs [%s]", cpus_s);
        die_msg("not a list of CPU numbers");
    }

    set_stage("becoming %s (uid %lu)", user, (unsigned long)uid);
    long groups_l[1024];
    int n_groups = numbers(groups_s, groups_l, 1024);
    if (n_groups < 0)
        die_msg("not a list of group numbers");
    gid_t groups[1024];
    for (int g = 0; g < n_groups; g++)
        groups[g] = (gid_t)groups_l[g];
    if (n_groups == 0)
        groups[n_groups++] = gid;
    if (geteuid() == 0) {
        if (setgroups((size_t)n_groups, groups) < 0 || setresgid(gid, gid, gid) < 0 ||
            setresuid(uid, uid, uid) < 0)
            die(NULL);
    } else if (geteuid() != uid) {
        char text[128];
        snprintf(text, sizeof text, "the supervisor runs as uid %lu, not root",
                 (unsigned long)geteuid());
        die_msg(text);
    }
    if (uid != 0 && (getuid() == 0 || geteuid() == 0)) {
        errno = EPERM;
        die(NULL);
    }
    setsid();
    umask(*umask_s ? (mode_t)(strtoul(umask_s, NULL, 8) & 0777) : 022);
    set_stage("setting the submitting shell's resource limits");
    if (set_limits(rlimits_s) < 0)
        die(NULL);

    /* From here on every path is the tenant's and is opened with the tenant's rights. */
    set_stage("entering the working directory %s", workdir);
    if (chdir(workdir) < 0)
        die(workdir);
    set_stage("opening the output file %s", out);
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC);
    if (*default_dir) {
        if (mkdirs(default_dir, 0700) < 0)
            die(default_dir);
        flags |= O_NOFOLLOW; /* our own default file is never a link */
    }
    int fd_out = open(out, flags, 0644);
    if (fd_out < 0)
        die(out);
    set_stage("opening the error file %s", err);
    int fd_err = strcmp(err, out) == 0 ? fd_out : open(err, flags, 0644);
    if (fd_err < 0)
        die(err);
    int fd_in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd_in < 0)
        die("/dev/null");
    if (dup2(fd_in, 0) < 0 || dup2(fd_out, 1) < 0 || dup2(fd_err, 2) < 0)
        die(NULL);

    set_stage("starting %s", job[0]);
    environ = job_env; /* execvp searches the job's PATH */
    execvp(job[0], job);
    die(job[0]);
    return 127;
}
