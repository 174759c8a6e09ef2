/* The stand-in's bash image: what makes a BusyBox built for Linux fail where hluk's crashes.
 *
 * hluk's bash image is BusyBox 1.36.1 built with CONFIG_NOMMU (hyperlight-unikraft's
 * drivers/busybox.Dockerfile): its shell, hush, starts every command that is not a builtin or
 * a NOFORK applet with vfork() and execs /bin/busybox. The repository's drivers/bash sources
 * and its bash coreutils example say that pipes and output redirects of external commands
 * crash the guest's kernel, "because vfork shares the parent's stack with the child": what
 * those constructs share is that the vfork child makes system calls (dup2, close, open, pipe,
 * fcntl, sigaction) before it execs, which a plain external command's child does not. So
 * here, compiled into every object of the stand-in's BusyBox (-include) with the calls below
 * wrapped at link time (-Wl,--wrap=NAME), a vfork child that makes one of those calls before
 * it execs, or that re-execs the shell itself (hush's NOMMU subshells, `$( )` and here-documents
 * to externals: `busybox sh -$...` / `-<`), ends the guest: it writes a byte to descriptor
 * HL_CRASH_FD, which the stand-in watches and answers as hluk answers a guest kernel that
 * aborted. Inferred from those sources and from tracing hush's children; never kinder than
 * the guest, possibly harsher where the guest would survive a call. */
#ifndef HL_STANDIN_NOMMU_H
#define HL_STANDIN_NOMMU_H
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#define HL_CRASH_FD 1021

__attribute__((weak)) volatile int hl_vfork_child;

/* The child sets the flag (its memory is the parent's), the parent clears it once it resumes,
 * after the child's exec or exit. A statement expression: the vfork stays in its caller. */
#define vfork() __extension__({ \
    pid_t hl__pid = (vfork)(); \
    hl_vfork_child = hl__pid == 0; \
    hl__pid; \
})

/* The crash: the stand-in, told, kills the guest. Until then the child waits, and its parent
 * with it (vfork): nothing of the guest runs on past the call, as nothing does in hluk's. */
__attribute__((weak, noreturn)) void hl_crash(void) {
    char byte = 'C';
    syscall(SYS_write, HL_CRASH_FD, &byte, 1);
    for (;;)
        syscall(SYS_pause);
}

#define HL_WRAP(type, name, params, args) \
    type __real_##name params; \
    __attribute__((weak)) type __wrap_##name params { \
        if (hl_vfork_child) hl_crash(); \
        return __real_##name args; \
    }

HL_WRAP(int, dup, (int a), (a))
HL_WRAP(int, dup2, (int a, int b), (a, b))
HL_WRAP(int, dup3, (int a, int b, int c), (a, b, c))
HL_WRAP(int, close, (int a), (a))
HL_WRAP(int, pipe, (int *a), (a))
HL_WRAP(int, pipe2, (int *a, int b), (a, b))
HL_WRAP(int, open, (const char *a, int b, int c), (a, b, c))
HL_WRAP(int, open64, (const char *a, int b, int c), (a, b, c))
HL_WRAP(int, openat, (int a, const char *b, int c, int d), (a, b, c, d))
HL_WRAP(int, openat64, (int a, const char *b, int c, int d), (a, b, c, d))
HL_WRAP(int, fcntl, (int a, int b, long c), (a, b, c))
HL_WRAP(int, fcntl64, (int a, int b, long c), (a, b, c))
HL_WRAP(int, sigaction, (int a, const struct sigaction *b, struct sigaction *c), (a, b, c))
HL_WRAP(int, sigprocmask, (int a, const sigset_t *b, sigset_t *c), (a, b, c))
HL_WRAP(pid_t, setsid, (void), ())
HL_WRAP(int, setpgid, (pid_t a, pid_t b), (a, b))

int __real_execve(const char *path, char *const argv[], char *const envp[]);
__attribute__((weak)) int __wrap_execve(const char *path, char *const argv[], char *const envp[]) {
    if (hl_vfork_child && argv[0] && argv[1] && argv[1][0] == '-'
            && (argv[1][1] == '$' || argv[1][1] == '<'))
        hl_crash();
    return __real_execve(path, argv, envp);
}

#endif
