/* A clock that runs at FASTCLOCK_RATE times real speed, for redis-server under test (LD_PRELOAD).
 *
 * Debian's faketime cannot do this: libfaketime recurses into jemalloc during its own initialisation and
 * the server never starts (libfaketime issues #130, #327, #478; Debian's redis-server links jemalloc). This
 * shim avoids the recursion by never calling dlsym or malloc: it reads the clocks with the raw syscall.
 * Every clock is scaled around the value it had when the process started, so time starts true and then
 * drifts at the given rate. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define CLOCKS 16
static double rate = 1.0;
static struct timespec base[CLOCKS];

static long long to_ns(const struct timespec *ts) { return (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec; }

__attribute__((constructor)) static void fastclock_init(void) {
    const char *value = getenv("FASTCLOCK_RATE");
    if (value != NULL) rate = strtod(value, NULL);
    if (rate <= 0) rate = 1.0;
    for (int id = 0; id < CLOCKS; id++) syscall(SYS_clock_gettime, id, &base[id]);
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int result = (int)syscall(SYS_clock_gettime, id, ts);
    if (result != 0 || rate == 1.0 || id < 0 || id >= CLOCKS) return result;
    long long start = to_ns(&base[id]);
    long long scaled = start + (long long)((double)(to_ns(ts) - start) * rate);
    ts->tv_sec = scaled / 1000000000LL;
    ts->tv_nsec = scaled % 1000000000LL;
    return 0;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int result = clock_gettime(CLOCK_REALTIME, &ts);
    if (result == 0 && tv != NULL) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return result;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
