/* Syscall prober for tests/sandbox/test_enumerate.py: which system calls reach the kernel?
 *
 * Usage: syscall_prober NR[,ARG0[,ARG1...]]...   (numbers in decimal or 0x hex)
 * Output, one line per probe:  NR RESULT ERRNO REACHED
 *
 * No probed call ever runs. Before probing, this thread stacks its own seccomp filter that
 * answers every probed number with SECCOMP_RET_USER_NOTIF; a second thread (not under that
 * filter) is the listener: it records the call as REACHED and answers it with an error, so the
 * kernel never executes it. Seccomp applies the most severe verdict of all stacked filters, and
 * ERRNO outranks USER_NOTIF: a call the sandbox's filter refuses returns the sandbox's errno and
 * never reaches the listener; a call the sandbox lets through reaches it. Unconfined (the
 * control), every probe reaches it: the probe can see a call that is let through.
 *
 * After the last probe the prober rings the listener once more (getppid); from then on the
 * listener lets every call continue, prints the table and the process exits normally.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_PROBES 2048
#define LISTENER_ERRNO EXDEV

struct probe {
    long nr;
    long args[6];
    long result;
    int err;
    volatile int reached;
};

static struct probe probes[MAX_PROBES];
static int nprobes;
static volatile int current = -1;
static volatile int done;
static volatile int listener_fd = -1;

static void *listener(void *unused) {
    (void)unused;
    /* handed over through memory: once the filter is in place, the probing thread's own
     * write() would already be intercepted */
    while (listener_fd < 0) sched_yield();
    int fd = listener_fd;
    struct seccomp_notif req;
    struct seccomp_notif_resp resp;
    for (;;) {
        memset(&req, 0, sizeof req);
        if (ioctl(fd, SECCOMP_IOCTL_NOTIF_RECV, &req) != 0) {
            if (errno == EINTR) continue;
            perror("NOTIF_RECV");
            _exit(4);
        }
        memset(&resp, 0, sizeof resp);
        resp.id = req.id;
        if (done) {
            if (done == 1) {
                for (int i = 0; i < nprobes; i++)
                    printf("%ld %ld %d %d\n", probes[i].nr, probes[i].result, probes[i].err,
                           probes[i].reached);
                fflush(stdout);
                done = 2;
            }
            resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
        } else {
            if (current >= 0 && probes[current].nr == (long)req.data.nr) probes[current].reached = 1;
            resp.error = -LISTENER_ERRNO;
        }
        if (ioctl(fd, SECCOMP_IOCTL_NOTIF_SEND, &resp) != 0 && errno != ENOENT) {
            perror("NOTIF_SEND");
            _exit(5);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc && nprobes < MAX_PROBES; i++) {
        char *p = argv[i];
        struct probe *pr = &probes[nprobes++];
        pr->nr = strtol(p, &p, 0);
        for (int a = 0; a < 6 && *p == ','; a++) pr->args[a] = (long)strtoul(p + 1, &p, 0);
    }
    /* the filter: every probed number (and the doorbell) -> USER_NOTIF, anything else ALLOW */
    struct sock_filter *f = calloc(2 * (size_t)nprobes + 8, sizeof *f);
    int n = 0;
    f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getppid, 0, 1);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF);
    for (int i = 0; i < nprobes; i++) {
        f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)probes[i].nr, 0, 1);
        f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF);
    }
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    struct sock_fprog prog = {.len = (unsigned short)n, .filter = f};

    pthread_t thread;
    if (pthread_create(&thread, NULL, listener, NULL) != 0) return 2;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) { perror("no_new_privs"); return 2; }
    int fd = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
    if (fd < 0) { perror("seccomp"); return 2; }
    listener_fd = fd;

    for (int i = 0; i < nprobes; i++) {
        struct probe *pr = &probes[i];
        current = i;
        errno = 0;
        pr->result = syscall(pr->nr, pr->args[0], pr->args[1], pr->args[2], pr->args[3],
                             pr->args[4], pr->args[5]);
        pr->err = pr->result == -1 ? errno : 0;
    }
    current = -1;
    done = 1;
    syscall(SYS_getppid); /* the doorbell: the listener prints, then lets everything continue */
    while (done != 2) { }
    return 0;
}
