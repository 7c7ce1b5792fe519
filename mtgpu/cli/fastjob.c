/*
 * mt-job's fast path: `mt-job submit [--parsable] FILE|-` and `mt-job list --json
 * [--all]` without starting Python.
 *
 * Submitting from a shell loop is what `sbatch` is measured on, and a Python
 * interpreter alone costs more per call than a whole `sbatch`. This client does one
 * thing: it reads the job file, sends one `job.submit` request over the API socket
 * named by MTGPU_API_SOCKET (the daemon sets it in every tenant session), reads the
 * one answer line and prints what the Python `mt-job submit` prints:
 *
 *   --parsable   the job id
 *   otherwise    "Submitted job ID" (+ " (N array tasks)" for an array)
 *   warnings     "mt-job: warning: TEXT" on standard error (and the answer's
 *                "notice", such as being over USER_DISK_LIMIT, as "mtgpu: warning: TEXT")
 *   refusal      "mt-job: TEXT" on standard error, exit status 1
 *   unknown      "mt-job: unknown: ... check `mt-job list`", exit status 75, when no
 *                answer came for a submission that may have been made (the same key
 *                was sent again for MTGPU_SUBMIT_RETRY seconds, 60 by default)
 *
 * `list --json` prints the answer's result as the Python mt-job does (indent 2, keys
 * sorted), and hands any failure to the Python mt-job, which retries and explains.
 *
 * Anything else (another command, submit --json, --config, directive overrides such as
 * --gpus=2, abbreviations, -h, no MTGPU_API_SOCKET) is handed to the Python mt-job
 * by exec, with the same arguments, before standard input is touched. The Python
 * mt-job is, in order: $MTGPU_JOB_PY, the path compiled in with
 * -DMTGPU_PY_MTJOB='"/path/to/mt-job.py"', or mt-job.py next to this executable.
 *
 * Build:  cc -O2 -o mt-job fastjob.c [-DMTGPU_PY_MTJOB='"/opt/mtgpu/bin/mt-job.py"']
 *
 * The wire format is the API's: one JSON object per line,
 *   {"op": "job.submit", "args": {"script": S, "overrides": {}, "workdir": W,
 *    "token": HEX}, "id": 1}
 * answered by {"id": 1, "ok": true, "result": {"job_id": "7", "tasks": 1,
 * "warnings": [], ...}} or {"id": 1, "ok": false, "error": TEXT, "code": WORD,
 * "retryable": BOOL}. The caller's identity is taken by the daemon from the socket
 * (SO_PEERCRED).
 *
 * Retries, as the Python mt-job's (mtgpu/api/client.py, mtgpu/cli/job.py), decided on
 * codes only (outcome_kind): "starting" for STARTING_RETRY_S; for SUBMIT_RETRY_S, a
 * refusal that says "retryable": true (nothing was done: an election's "no_leader",
 * say), or whose code is in RESEND_CODES (the outcome is unknown: the same key makes
 * a second send of a committed submission return the same job). An outcome still
 * unknown at the end exits EXIT_UNKNOWN, as the Python client does.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef MTGPU_PY_MTJOB
#define MTGPU_PY_MTJOB ""
#endif

#define TIMEOUT_S 60 /* as the Python client */
#define STARTING_RETRY_S 120 /* ApiClient.STARTING_RETRY */
#define SUBMIT_RETRY_S 60 /* mt-job's SUBMIT_RETRY (MTGPU_SUBMIT_RETRY overrides it) */
#define SUBMIT_NOTICE_S 5 /* mt-job's SUBMIT_NOTICE: a failover's resends are not told */
#define MAX_JOB_SCRIPT (2 << 20) /* the largest JOB_SCRIPT_MAX (mtgpu.config.options) */
#define EXIT_UNKNOWN 75 /* mt-job's EXIT_UNKNOWN: the submission's outcome is unknown */

/* mtgpu.errors.RETRYABLE_CODES: for an answer without "retryable". */
static const char *const RETRYABLE_CODES[] = {"starting", "not_caught_up", "no_leader", "busy",
                                              NULL};
/* mtgpu.errors.RESEND_CODES (the outcome is unknown): "no_answer" and "closed" are
 * this client's own. */
static const char *const RESEND_CODES[] = {"in_doubt", "leader_changed", "unreachable", "no_answer",
                                           "closed", NULL};

static int code_in(const char *code, const char *const *codes) {
    for (; *codes; codes++)
        if (strcmp(code, *codes) == 0)
            return 1;
    return 0;
}

static char **g_argv;

/* ------------------------------------------------------------------ buffers */

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

static void die_oom(void) {
    fputs("mt-job: out of memory\n", stderr);
    exit(1);
}

static void buf_reserve(buf_t *b, size_t more) {
    if (b->len + more + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        die_oom();
    b->p = p;
    b->cap = cap;
}

static void buf_add(buf_t *b, const char *s, size_t n) {
    buf_reserve(b, n);
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void buf_adds(buf_t *b, const char *s) { buf_add(b, s, strlen(s)); }

static void buf_addc(buf_t *b, char c) { buf_add(b, &c, 1); }

/* ------------------------------------------------------- the Python mt-job */

static int same_file_as_self(const char *path) {
    struct stat a, b;
    return stat(path, &a) == 0 && stat("/proc/self/exe", &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

static void try_exec(const char *path) {
    if (path && *path && access(path, X_OK) == 0 && !same_file_as_self(path))
        execv(path, g_argv);
}

/* Everything this client does not do itself: run the Python mt-job instead. */
static void exec_python(void) {
    try_exec(getenv("MTGPU_JOB_PY"));
    try_exec(MTGPU_PY_MTJOB);
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 16);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            strcpy(slash + 1, "mt-job.py");
            try_exec(self);
        }
    }
    fputs("mt-job: this fast mt-job only submits; the full mt-job (mt-job.py) was not found "
          "next to it. Set MTGPU_JOB_PY to its path, or reinstall MTGPU\n",
          stderr);
    exit(2);
}

/* ------------------------------------------------------------------- input */

static int read_all(int fd, buf_t *b) {
    for (;;) {
        buf_reserve(b, 65536);
        ssize_t n = read(fd, b->p + b->len, b->cap - b->len - 1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0)
            break;
        b->len += (size_t)n;
    }
    if (b->p == NULL)
        buf_reserve(b, 1);
    b->p[b->len] = '\0';
    return 0;
}

/* Python's text mode for files: "\r\n" and "\r" read as "\n". */
static void universal_newlines(buf_t *b) {
    size_t w = 0;
    for (size_t r = 0; r < b->len; r++) {
        char c = b->p[r];
        if (c == '\r') {
            if (r + 1 < b->len && b->p[r + 1] == '\n')
                r++;
            c = '\n';
        }
        b->p[w++] = c;
    }
    b->len = w;
    b->p[w] = '\0';
}

/* Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. The offset
 * of the first byte that is not, or n for valid text. */
static size_t utf8_error(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) {
            k = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            cp = c & 0x07;
        } else {
            return i;
        }
        for (size_t j = 1; j <= k; j++) {
            if (i + j >= n || (s[i + j] & 0xC0) != 0x80)
                return i;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += k + 1;
    }
    return n;
}

/* ------------------------------------------------------------- JSON output */

static void json_string(buf_t *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    buf_reserve(b, n + 2);
    buf_addc(b, '"');
    size_t run = 0; /* bytes copied as they are, flushed in one go */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[7];
        if (c == '"')
            esc = "\\\"";
        else if (c == '\\')
            esc = "\\\\";
        else if (c == '\n')
            esc = "\\n";
        else if (c == '\t')
            esc = "\\t";
        else if (c == '\r')
            esc = "\\r";
        else if (c == '\b')
            esc = "\\b";
        else if (c == '\f')
            esc = "\\f";
        else if (c < 0x20) {
            u[0] = '\\', u[1] = 'u', u[2] = '0', u[3] = '0', u[4] = hex[c >> 4], u[5] = hex[c & 15];
            u[6] = '\0';
            esc = u;
        }
        if (esc) {
            buf_add(b, s + i - run, run);
            run = 0;
            buf_adds(b, esc);
        } else {
            run++;
        }
    }
    buf_add(b, s + n - run, run);
    buf_addc(b, '"');
}

/* -------------------------------------------------------------- JSON input */
/* Just enough of a parser for the answer: objects, arrays, strings, literals. */

typedef struct {
    const char *p, *end;
} scan_t;

static void ws(scan_t *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static int lit(scan_t *s, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
        return 0;
    s->p += n;
    return 1;
}

static void put_utf8(buf_t *b, uint32_t cp) {
    char o[4];
    if (cp < 0x80) {
        o[0] = (char)cp;
        buf_add(b, o, 1);
    } else if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6)), o[1] = (char)(0x80 | (cp & 0x3F));
        buf_add(b, o, 2);
    } else if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)), o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        buf_add(b, o, 3);
    } else {
        o[0] = (char)(0xF0 | (cp >> 18)), o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), o[3] = (char)(0x80 | (cp & 0x3F));
        buf_add(b, o, 4);
    }
}

static int hex4(scan_t *s, uint32_t *v) {
    if (s->end - s->p < 4)
        return 0;
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s->p[i];
        int d = (c >= '0' && c <= '9') ? c - '0'
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                         : -1;
        if (d < 0)
            return 0;
        *v = (*v << 4) | (uint32_t)d;
    }
    s->p += 4;
    return 1;
}

/* A string at s->p, decoded into out (if not NULL). */
static int str(scan_t *s, buf_t *out) {
    if (s->p >= s->end || *s->p != '"')
        return 0;
    s->p++;
    buf_t tmp = {0};
    buf_t *b = out ? out : &tmp;
    while (s->p < s->end && *s->p != '"') {
        char c = *s->p++;
        if (c != '\\') {
            buf_addc(b, c);
            continue;
        }
        if (s->p >= s->end)
            break;
        c = *s->p++;
        switch (c) {
        case '"': case '\\': case '/': buf_addc(b, c); break;
        case 'n': buf_addc(b, '\n'); break;
        case 't': buf_addc(b, '\t'); break;
        case 'r': buf_addc(b, '\r'); break;
        case 'b': buf_addc(b, '\b'); break;
        case 'f': buf_addc(b, '\f'); break;
        case 'u': {
            uint32_t cp, lo;
            if (!hex4(s, &cp))
                goto bad;
            if (cp >= 0xD800 && cp <= 0xDBFF && s->end - s->p >= 6 && s->p[0] == '\\' &&
                s->p[1] == 'u') {
                scan_t save = *s;
                s->p += 2;
                if (hex4(s, &lo) && lo >= 0xDC00 && lo <= 0xDFFF)
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else
                    *s = save;
            }
            if (cp >= 0xD800 && cp <= 0xDFFF)
                cp = 0xFFFD; /* a lone surrogate cannot be printed as UTF-8 */
            put_utf8(b, cp);
            break;
        }
        default:
            goto bad;
        }
    }
    if (s->p >= s->end)
        goto bad;
    s->p++;
    if (!b->p)
        buf_reserve(b, 1), b->p[0] = '\0';
    free(tmp.p);
    return 1;
bad:
    free(tmp.p);
    return 0;
}

static int value(scan_t *s, int depth);

/* Calls fn(key) for each member of the object at s->p; fn parses or skips the value. */
typedef int (*member_fn)(scan_t *s, const char *key, void *ctx);

static int object(scan_t *s, int depth, member_fn fn, void *ctx) {
    if (depth > 64 || s->p >= s->end || *s->p != '{')
        return 0;
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return 1;
    }
    for (;;) {
        buf_t key = {0};
        ws(s);
        if (!str(s, &key)) {
            free(key.p);
            return 0;
        }
        ws(s);
        if (s->p >= s->end || *s->p != ':') {
            free(key.p);
            return 0;
        }
        s->p++;
        ws(s);
        int ok = fn ? fn(s, key.p, ctx) : value(s, depth + 1);
        free(key.p);
        if (!ok)
            return 0;
        ws(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            continue;
        }
        if (s->p < s->end && *s->p == '}') {
            s->p++;
            return 1;
        }
        return 0;
    }
}

static int value(scan_t *s, int depth) {
    ws(s);
    if (depth > 64 || s->p >= s->end)
        return 0;
    char c = *s->p;
    if (c == '{')
        return object(s, depth, NULL, NULL);
    if (c == '[') {
        s->p++;
        ws(s);
        if (s->p < s->end && *s->p == ']') {
            s->p++;
            return 1;
        }
        for (;;) {
            if (!value(s, depth + 1))
                return 0;
            ws(s);
            if (s->p < s->end && *s->p == ',') {
                s->p++;
                continue;
            }
            if (s->p < s->end && *s->p == ']') {
                s->p++;
                return 1;
            }
            return 0;
        }
    }
    if (c == '"')
        return str(s, NULL);
    if (lit(s, "true") || lit(s, "false") || lit(s, "null"))
        return 1;
    const char *start = s->p; /* a number */
    while (s->p < s->end && strchr("+-0123456789.eE", *s->p))
        s->p++;
    return s->p > start;
}

typedef struct {
    int ok;          /* -1 unknown, 0 false, 1 true */
    buf_t error;     /* "error" */
    buf_t code;      /* "code": the refusal's kind */
    int retryable;   /* "retryable": -1 absent, 0 false, 1 true */
    buf_t job_id;    /* result.job_id (a string, or a number's text) */
    long tasks;      /* result.tasks */
    buf_t warnings;  /* result.warnings, each followed by '\0' */
    int n_warnings;
    buf_t notice;    /* "notice": a warning for the caller (over USER_DISK_LIMIT, say) */
    buf_t test_only; /* result.test_only: when and where a --test-only job would start */
    int wait;        /* result.wait: #SBATCH --wait (the Python mt-job waits) */
    int keep_result; /* list: keep the text of "result" instead of reading it */
    int more;        /* "next_cursor": the list has more pages (the Python mt-job reads them) */
    const char *result, *result_end;
} answer_t;

static int result_member(scan_t *s, const char *key, void *ctx) {
    answer_t *a = ctx;
    if (strcmp(key, "job_id") == 0) {
        if (s->p < s->end && *s->p == '"')
            return str(s, &a->job_id);
        const char *start = s->p;
        if (!value(s, 2))
            return 0;
        buf_add(&a->job_id, start, (size_t)(s->p - start));
        return 1;
    }
    if (strcmp(key, "test_only") == 0 && s->p < s->end && *s->p == '"')
        return str(s, &a->test_only);
    if (strcmp(key, "wait") == 0) {
        a->wait = lit(s, "true");
        return a->wait || value(s, 2);
    }
    if (strcmp(key, "tasks") == 0) {
        const char *start = s->p;
        if (!value(s, 2))
            return 0;
        a->tasks = strtol(start, NULL, 10);
        return 1;
    }
    if (strcmp(key, "warnings") == 0 && s->p < s->end && *s->p == '[') {
        s->p++;
        ws(s);
        if (s->p < s->end && *s->p == ']') {
            s->p++;
            return 1;
        }
        for (;;) {
            ws(s);
            if (s->p < s->end && *s->p == '"') {
                if (!str(s, &a->warnings))
                    return 0;
                buf_addc(&a->warnings, '\0');
                a->n_warnings++;
            } else if (!value(s, 3)) {
                return 0;
            }
            ws(s);
            if (s->p < s->end && *s->p == ',') {
                s->p++;
                continue;
            }
            if (s->p < s->end && *s->p == ']') {
                s->p++;
                return 1;
            }
            return 0;
        }
    }
    return value(s, 2);
}

static int answer_member(scan_t *s, const char *key, void *ctx) {
    answer_t *a = ctx;
    if (strcmp(key, "ok") == 0) {
        if (lit(s, "true"))
            a->ok = 1;
        else if (value(s, 1))
            a->ok = 0;
        else
            return 0;
        return 1;
    }
    if (strcmp(key, "error") == 0 && s->p < s->end && *s->p == '"')
        return str(s, &a->error);
    if (strcmp(key, "code") == 0 && s->p < s->end && *s->p == '"')
        return str(s, &a->code);
    if (strcmp(key, "retryable") == 0) {
        if (lit(s, "true"))
            a->retryable = 1;
        else if (lit(s, "false"))
            a->retryable = 0;
        else
            return value(s, 1);
        return 1;
    }
    if (strcmp(key, "notice") == 0 && s->p < s->end && *s->p == '"')
        return str(s, &a->notice);
    if (strcmp(key, "next_cursor") == 0) {
        a->more = !lit(s, "null");
        return !a->more || value(s, 1);
    }
    if (strcmp(key, "result") == 0 && a->keep_result) {
        a->result = s->p;
        if (!value(s, 1))
            return 0;
        a->result_end = s->p;
        return 1;
    }
    if (strcmp(key, "result") == 0 && s->p < s->end && *s->p == '{')
        return object(s, 1, result_member, a);
    return value(s, 1);
}

/* ------------------------------------------------------------------ socket */

static int write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("mt-job: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* A connection to the API socket, with timeouts; -1 (errno set) if there is none. */
static int open_api(const char *path) {
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

/* open_api, or the reason there is no connection, and exit. */
static int connect_api(const char *path) {
    int fd = open_api(path);
    if (fd >= 0)
        return fd;
    if (errno == ENAMETOOLONG)
        fail("cannot reach the MTGPU daemon at %s: the socket path is too long; "
             "check `mtgpu-setup status`", path);
    if (errno == ENOENT)
        fail("MTGPU is not running here (%s does not exist); start it with "
             "`mtgpu-setup install --yes` or check `mtgpu-setup status`", path);
    fail("cannot reach the MTGPU daemon at %s: %s; check `mtgpu-setup status`", path,
         strerror(errno));
    return -1;
}

/* Send one request on fd and read one answer line into ans (*nl: its newline); closes
 * fd. 0, or -1 (errno set) if sending or reading failed, or -2 if the daemon closed
 * the connection first. */
static int exchange(int fd, const buf_t *req, buf_t *ans, char **nl) {
    int rc = 0;
    *nl = NULL;
    if (write_all(fd, req->p, req->len) < 0)
        rc = -1;
    while (rc == 0 && *nl == NULL) {
        buf_reserve(ans, 65536);
        ssize_t n = recv(fd, ans->p + ans->len, ans->cap - ans->len - 1, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = n < 0 ? -1 : -2;
            break;
        }
        *nl = memchr(ans->p + ans->len, '\n', (size_t)n);
        ans->len += (size_t)n;
    }
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

static void random_hex(char out[33]) {
    unsigned char r[16];
    size_t got = 0;
    while (got < sizeof r) {
        ssize_t n = getrandom(r + got, sizeof r - got, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
            if (fd < 0 || read(fd, r, sizeof r) != (ssize_t)sizeof r)
                fail("cannot read random bytes for the submission token: %s", strerror(errno));
            close(fd);
            got = sizeof r;
            break;
        }
        got += (size_t)n;
    }
    r[6] = (r[6] & 0x0F) | 0x40; /* the shape of a version-4 UUID, as the Python mt-job sends */
    r[8] = (r[8] & 0x3F) | 0x80;
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++)
        out[2 * i] = hex[r[i] >> 4], out[2 * i + 1] = hex[r[i] & 15];
    out[32] = '\0';
}

/* ------------------------------------------------ what the shell hands its job */

/* mtgpu.schedd.submitenv.MAX_SENT_ENV_BYTES: the most environment a submission carries. */
#define MAX_SENT_ENV_BYTES (1 << 20)

extern char **environ;

/* The submitting shell's umask, resource limits and environment, as the Python mt-job
 * sends them (submitting_session): "umask": N, "rlimits": {"nofile": [soft, hard]}
 * (-1 unlimited), "env": {NAME: VALUE} without the variables that are not UTF-8. */
static void add_session(buf_t *req) {
    static const struct {
        const char *name;
        int res;
    } limits[] = {{"as", RLIMIT_AS},         {"core", RLIMIT_CORE},       {"cpu", RLIMIT_CPU},
                  {"data", RLIMIT_DATA},     {"fsize", RLIMIT_FSIZE},     {"memlock", RLIMIT_MEMLOCK},
                  {"nofile", RLIMIT_NOFILE}, {"nproc", RLIMIT_NPROC},     {"rss", RLIMIT_RSS},
                  {"stack", RLIMIT_STACK}};
    char num[64];
    mode_t mask = umask(022);
    umask(mask);
    snprintf(num, sizeof num, ", \"umask\": %u, \"rlimits\": {", (unsigned)mask);
    buf_adds(req, num);
    for (size_t k = 0; k < sizeof limits / sizeof limits[0]; k++) {
        struct rlimit r;
        if (getrlimit(limits[k].res, &r) < 0)
            continue;
        snprintf(num, sizeof num, "%s\"%s\": [%lld, %lld]", k ? ", " : "", limits[k].name,
                 r.rlim_cur == RLIM_INFINITY ? -1LL : (long long)r.rlim_cur,
                 r.rlim_max == RLIM_INFINITY ? -1LL : (long long)r.rlim_max);
        buf_adds(req, num);
    }
    buf_adds(req, "}, \"env\": {");
    size_t total = 0;
    int first = 1;
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        size_t len = strlen(*e);
        if (eq == NULL || eq == *e || utf8_error((const unsigned char *)*e, len) < len)
            continue;
        total += len + 1;
        if (total > MAX_SENT_ENV_BYTES)
            fail("your environment is over the %d bytes a submission carries; unset what the "
                 "job does not need (or submit with env -i)", MAX_SENT_ENV_BYTES);
        if (!first)
            buf_adds(req, ", ");
        first = 0;
        json_string(req, *e, (size_t)(eq - *e));
        buf_adds(req, ": ");
        json_string(req, eq + 1, len - (size_t)(eq - *e) - 1);
    }
    buf_addc(req, '}');
}

/* ------------------------------------------------- retries of one submission */

/* What an answer says about its submission, as mt-job's submit_once reads it: 0
 * decided (made, or refused), 1 nothing was done (no scheduler reachable from this
 * member, a replica behind, a daemon starting; after an attempt in doubt, the submit
 * limits too), 2 in doubt (it may have been made). 1 and 2 are sent again with the
 * same key, which returns the first outcome if there was one. */
static int outcome_kind(const char *code, int retryable, int doubt) {
    if (code == NULL)
        return 0;
    if (code_in(code, RESEND_CODES))
        return 2;
    if (retryable == 1 || (retryable < 0 && code_in(code, RETRYABLE_CODES)))
        return 1;
    return doubt && (strcmp(code, "rate_limited") == 0 || strcmp(code, "queue_full") == 0 ||
                     strcmp(code, "not_running") == 0);
}

/* MTGPU_SUBMIT_RETRY (seconds, 0 to 3600), or SUBMIT_RETRY_S. */
static double submit_retry_s(void) {
    const char *v = getenv("MTGPU_SUBMIT_RETRY");
    char *end;
    double d = v && *v ? strtod(v, &end) : -1;
    return v && *v && *end == '\0' && d >= 0 && d <= 3600 ? d : SUBMIT_RETRY_S;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* ------------------------------------------------------------ JSON output */

static void indent(buf_t *b, int depth) {
    buf_addc(b, '\n');
    for (int i = 0; i < depth; i++)
        buf_adds(b, "  ");
}

/* Re-indent JSON text as Python's json.dumps(indent=2) lays it out. The daemon sends
 * its answers with sorted keys and ASCII escapes, so the result is what the Python
 * mt-job prints (json.dumps(..., indent=2, sort_keys=True)), byte for byte. */
static void pretty(buf_t *b, const char *p, const char *end) {
    int depth = 0;
    while (p < end) {
        char c = *p++;
        if (c == '"') {
            const char *start = p - 1;
            while (p < end && *p != '"')
                p += (*p == '\\' && p + 1 < end) ? 2 : 1;
            p++;
            buf_add(b, start, (size_t)(p - start));
        } else if (c == '{' || c == '[') {
            const char *q = p;
            while (q < end && (*q == ' ' || *q == '\n'))
                q++;
            if (q < end && *q == (c == '{' ? '}' : ']')) {
                buf_addc(b, c);
                buf_addc(b, *q);
                p = q + 1;
            } else {
                buf_addc(b, c);
                indent(b, ++depth);
            }
        } else if (c == '}' || c == ']') {
            indent(b, --depth);
            buf_addc(b, c);
        } else if (c == ',') {
            buf_addc(b, ',');
            indent(b, depth);
        } else if (c == ':') {
            buf_adds(b, ": ");
        } else if (c != ' ' && c != '\n' && c != '\t' && c != '\r') {
            buf_addc(b, c);
        }
    }
}

/* `mt-job list --json [--all]`: what pollers run several times a second. Anything
 * unusual (no daemon, a refusal, an election) goes to the Python mt-job, which
 * retries and explains: nothing has been consumed, and listing twice is harmless. */
static int list_json(int all) {
    const char *sock = getenv("MTGPU_API_SOCKET");
    if (sock == NULL || *sock == '\0')
        exec_python();
    buf_t req = {0};
    buf_adds(&req, "{\"op\": \"job.list\", \"args\": {\"all\": ");
    buf_adds(&req, all ? "true" : "null");
    buf_adds(&req, ", \"user\": null}, \"id\": 1}\n");
    buf_t ans = {0};
    char *nl = NULL;
    int fd = open_api(sock);
    if (fd < 0 || exchange(fd, &req, &ans, &nl) != 0)
        exec_python();
    answer_t a = {.ok = -1, .keep_result = 1};
    scan_t s = {ans.p, nl};
    ws(&s);
    if (!object(&s, 0, answer_member, &a) || a.ok != 1 || a.result == NULL || a.more)
        exec_python(); /* more than one page: the Python mt-job follows the cursor */
    if (a.notice.p)
        fprintf(stderr, "mtgpu: warning: %s\n", a.notice.p);
    buf_t out = {0};
    pretty(&out, a.result, a.result_end);
    buf_addc(&out, '\n');
    return fwrite(out.p, 1, out.len, stdout) == out.len && fflush(stdout) == 0 ? 0 : 1;
}

/* -------------------------------------------------------------------- main */

int main(int argc, char **argv) {
    g_argv = argv;
    if (argc >= 3 && strcmp(argv[1], "list") == 0) {
        int json = 0, all = 0;
        for (int i = 2; i < argc; i++) {
            if (strcmp(argv[i], "--json") == 0)
                json = 1;
            else if (strcmp(argv[i], "--all") == 0 || strcmp(argv[i], "-a") == 0)
                all = 1;
            else
                exec_python(); /* --user, --config, the table... */
        }
        if (!json)
            exec_python();
        return list_json(all);
    }
    if (argc < 3 || strcmp(argv[1], "submit") != 0)
        exec_python();
    int parsable = 0;
    const char *file = NULL;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (file != NULL)
            exec_python(); /* the script's arguments ($1...), which the Python mt-job sends */
        else if (strcmp(a, "--parsable") == 0)
            parsable = 1;
        else if ((strcmp(a, "-") == 0 || a[0] != '-') && file == NULL)
            file = a;
        else
            exec_python(); /* --json, --config, overrides, -h, a second file... */
    }
    const char *sock = getenv("MTGPU_API_SOCKET");
    if (file == NULL || sock == NULL || *sock == '\0')
        exec_python();

    buf_t script = {0};
    char cwd[PATH_MAX] = "";
    if (strcmp(file, "-") == 0) {
        if (read_all(0, &script) < 0)
            fail("cannot read standard input: %s", strerror(errno));
    } else {
        int fd = open(file, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || read_all(fd, &script) < 0)
            fail("cannot read %s: %s", file, strerror(errno));
        close(fd);
        universal_newlines(&script);
        if (!getcwd(cwd, sizeof cwd))
            fail("cannot tell the current directory: %s", strerror(errno));
    }
    size_t bad = utf8_error((const unsigned char *)script.p, script.len);
    if (bad < script.len) {
        size_t line = 1;
        for (size_t i = 0; i < bad; i++)
            line += script.p[i] == '\n';
        fail("%s is not UTF-8 text: byte 0x%02x at offset %zu (line %zu); save it as UTF-8 "
             "(iconv -t UTF-8)", strcmp(file, "-") == 0 ? "the job file" : file,
             (unsigned char)script.p[bad], bad, line);
    }
    if (script.len > MAX_JOB_SCRIPT)
        fail("the job script is %zu bytes, over the largest JOB_SCRIPT_MAX (%d); keep data in "
             "files beside the script and read them from it", script.len, MAX_JOB_SCRIPT);
    if (utf8_error((const unsigned char *)cwd, strlen(cwd)) < strlen(cwd))
        fail("the current directory's name is not valid UTF-8; submit from another directory");

    char token[33];
    random_hex(token);
    buf_t req = {0};
    buf_reserve(&req, script.len + script.len / 8 + 256);
    buf_adds(&req, "{\"op\": \"job.submit\", \"args\": {\"script\": ");
    json_string(&req, script.p, script.len);
    buf_adds(&req, ", \"overrides\": {}, \"workdir\": ");
    json_string(&req, cwd, strlen(cwd));
    const char *base = strrchr(file, '/');
    buf_adds(&req, ", \"file_name\": ");
    base = base ? base + 1 : file;
    if (utf8_error((const unsigned char *)base, strlen(base)) < strlen(base))
        base = ""; /* the daemon names the job as sbatch names a nameless one */
    json_string(&req, base, strlen(base));
    add_session(&req);
    buf_adds(&req, ", \"token\": \"");
    buf_adds(&req, token);
    buf_adds(&req, "\"}, \"id\": 1}\n");

    /* Sent again with the same request (the same key) while nothing was done (a daemon
     * still loading its state, an election, a member cut off from its scheduler) or
     * its outcome is in doubt (no answer, a relay or commit that timed out), as the
     * Python mt-job does: a retry of a submission that was made returns its job. */
    answer_t a;
    double begun = now_s(), limit = submit_retry_s();
    int doubt = 0, told = 0;
    char why[512] = "", doubted[512] = "";
    for (;;) {
        buf_t ans = {0};
        char *nl = NULL;
        /* After an attempt in doubt, a daemon that is gone for a moment is no verdict. */
        int fd = doubt ? open_api(sock) : connect_api(sock);
        int rc = fd < 0 ? -3 : exchange(fd, &req, &ans, &nl);
        int kind, starting = 0;
        a = (answer_t){.ok = -1, .tasks = 1, .retryable = -1};
        if (rc == -3) {
            kind = 1;
            snprintf(why, sizeof why, "cannot reach the MTGPU daemon: %s", strerror(errno));
        } else if (rc < 0) {
            kind = 2;
            snprintf(why, sizeof why, "the MTGPU daemon %s", rc == -2 ? "closed the connection" :
                     errno == EAGAIN || errno == EWOULDBLOCK ? "did not answer: timed out" :
                     strerror(errno));
        } else {
            scan_t s = {ans.p, nl};
            ws(&s);
            if (!object(&s, 0, answer_member, &a))
                fail("the MTGPU daemon sent an answer that is not JSON");
            kind = a.ok == 1 ? 0 : outcome_kind(a.code.p, a.retryable, doubt);
            starting = a.code.p && strcmp(a.code.p, "starting") == 0;
            snprintf(why, sizeof why, "%s", a.error.p ? a.error.p : "request refused");
        }
        if (kind == 0)
            break;
        if (kind == 2) {
            doubt = 1;
            memcpy(doubted, why, sizeof why);
        }
        if (now_s() - begun > (starting && limit < STARTING_RETRY_S ? STARTING_RETRY_S : limit)) {
            if (doubt) {
                fprintf(stderr, "mt-job: unknown: the submission may or may not have been made "
                        "(%s); check `mt-job list`\n", doubted);
                return EXIT_UNKNOWN;
            }
            fail("not submitted: %s", why);
        }
        if (!told && !starting && now_s() - begun >= SUBMIT_NOTICE_S) {
            fprintf(stderr, "mt-job: %s; retrying\n", why);
            told = 1;
        }
        usleep(500000);
    }
    if (a.ok != 1)
        fail("%s", a.error.p ? a.error.p : "request refused");
    if (a.test_only.p) { /* #SBATCH --test-only: nothing was submitted */
        for (const char *w = a.warnings.p; w && w < a.warnings.p + a.warnings.len; w += strlen(w) + 1)
            fprintf(stderr, "mt-job: warning: %s\n", w);
        fprintf(stderr, "mt-job: %s\n", a.test_only.p);
        return 0;
    }
    if (!a.job_id.p)
        fail("the MTGPU daemon's answer has no job id");
    if (a.notice.p)
        fprintf(stderr, "mtgpu: warning: %s\n", a.notice.p);
    const char *w = a.warnings.p;
    for (int i = 0; i < a.n_warnings; i++) {
        fprintf(stderr, "mt-job: warning: %s\n", w);
        w += strlen(w) + 1;
    }
    if (parsable)
        printf("%s\n", a.job_id.p);
    else if (a.tasks > 1)
        printf("Submitted job %s (%ld array tasks)\n", a.job_id.p, a.tasks);
    else
        printf("Submitted job %s\n", a.job_id.p);
    if (fflush(stdout) != 0)
        return 1;
    if (a.wait) { /* #SBATCH --wait: the Python mt-job waits for the job and exits as it did */
        static char *wait_argv[4];
        wait_argv[0] = g_argv[0], wait_argv[1] = "wait", wait_argv[2] = a.job_id.p, wait_argv[3] = NULL;
        g_argv = wait_argv;
        exec_python();
    }
    return 0;
}
