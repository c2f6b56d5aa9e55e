/* log.c — leveled logging to stderr (see log.h). Thread-safe: one fprintf per line. */
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdatomic.h>

static atomic_int g_level = HLOG_LEVEL_WARN;

void hlog_set_level(int level) { atomic_store(&g_level, level); }
int hlog_get_level(void) { return atomic_load(&g_level); }

void hlog(int level, const char *fmt, ...) {
  if (level > atomic_load(&g_level)) return;
  static const char *names[] = {"error", "warn", "info", "debug"};
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "hearth: %s: %s\n", names[level < 0 ? 0 : level > 3 ? 3 : level], line);
}
