/* Shifts the wall clock (CLOCK_REALTIME) of the process it is preloaded into by
 * WALLSHIFT_SECONDS, and leaves every other clock alone: a box whose clock is wrong, as one
 * without a real-time clock is before NTP sets it. libfaketime does this and more, but is not
 * on a fresh machine, where the README's test command must run; a C compiler is (cargo links
 * with it). Built by the test that needs it (tests/faults.rs). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

typedef int (*clock_fn)(clockid_t, struct timespec *);

int clock_gettime(clockid_t id, struct timespec *ts) {
    /* Threads may race to look it up: each finds the same address. */
    static clock_fn real;
    clock_fn f = __atomic_load_n(&real, __ATOMIC_ACQUIRE);
    if (!f) {
        f = (clock_fn)dlsym(RTLD_NEXT, "clock_gettime");
        __atomic_store_n(&real, f, __ATOMIC_RELEASE);
    }
    int rc = f(id, ts);
    const char *shift = getenv("WALLSHIFT_SECONDS");
    if (rc == 0 && id == CLOCK_REALTIME && shift)
        ts->tv_sec += atol(shift);
    return rc;
}
