/* trace.h — a sink for Chrome trace-event JSON (the JSON Array Format that
 * Perfetto and chrome://tracing open): `[`, then one event per line
 * separated by commas, then `]` when the sink is closed. Each event is one
 * write(2) of a whole line, so a file whose process died holds only whole
 * events and lacks only the closing bracket, which Perfetto accepts.
 *
 *   htrace *t; htrace_open("run.json", 0, &t, &err);
 *   htrace_track(t, 2, "req 1", 2);                      // a named track (thread)
 *   double t0 = htrace_now();
 *   ...
 *   htrace_complete(t, 2, "prefill", "request", t0, htrace_now() - t0,
 *                   (htrace_arg[]){HTRACE_INT("tokens", 128)}, 1);
 *   htrace_close(t);                                      // writes the `]`
 *
 * Times are CLOCK_MONOTONIC seconds (htrace_now) and are written as
 * microseconds since the sink was opened. Thread-safe: any thread may add
 * events. A NULL sink accepts every call and does nothing, so a caller's
 * cost when tracing is off is one test per span. Past max_bytes of events
 * the sink writes nothing more and logs that once.
 */
#ifndef HEARTH_BASE_TRACE_H
#define HEARTH_BASE_TRACE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

#define HTRACE_DEFAULT_MAX_BYTES ((int64_t)256 << 20)

typedef struct htrace htrace;

/* One entry of an event's "args": a string (str set) or a whole number. */
typedef struct htrace_arg {
  const char *key; /* borrowed */
  const char *str; /* borrowed; NULL: the value is num */
  int64_t num;
} htrace_arg;

#define HTRACE_INT(k, v) ((htrace_arg){.key = (k), .str = NULL, .num = (int64_t)(v)})
#define HTRACE_STR(k, v) ((htrace_arg){.key = (k), .str = (v), .num = 0})

/* Creates (truncates) path and writes the opening bracket and the process's
 * name. max_bytes <= 0: HTRACE_DEFAULT_MAX_BYTES. *out: htrace_close. */
int htrace_open(const char *path, int64_t max_bytes, htrace **out, herr *err);
/* Writes the closing bracket and closes the file. NULL is a no-op. */
void htrace_close(htrace *t);

/* CLOCK_MONOTONIC in seconds: the clock every event's times are on. */
double htrace_now(void);

/* Names track tid (a "thread" of the process in the viewer) and places it
 * among the tracks by sort_index (smaller first). */
void htrace_track(htrace *t, int64_t tid, const char *name, int64_t sort_index);
/* A span ("ph": "X") on track tid from start for dur seconds. Spans of one
 * track must nest: a span that starts inside another ends inside it. */
void htrace_complete(htrace *t, int64_t tid, const char *name, const char *cat, double start, double dur,
                     const htrace_arg *args, int n_args);
/* A moment ("ph": "i", thread scope) on track tid. */
void htrace_instant(htrace *t, int64_t tid, const char *name, const char *cat, double at, const htrace_arg *args,
                    int n_args);

/* Counters: event bytes written so far (without the brackets), events dropped past max_bytes. */
int64_t htrace_bytes(htrace *t);
int64_t htrace_dropped(htrace *t);

#endif
