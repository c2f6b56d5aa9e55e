/* log.h — leveled logging to stderr. The CLI maps --quiet / --verbose onto
 * hlog_set_level; library code logs through the macros below. */
#ifndef HEARTH_BASE_LOG_H
#define HEARTH_BASE_LOG_H

enum { HLOG_LEVEL_ERROR = 0, HLOG_LEVEL_WARN = 1, HLOG_LEVEL_INFO = 2, HLOG_LEVEL_DEBUG = 3 };

void hlog_set_level(int level);
int hlog_get_level(void);
void hlog(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define HLOG_ERROR(...) hlog(HLOG_LEVEL_ERROR, __VA_ARGS__)
#define HLOG_WARN(...) hlog(HLOG_LEVEL_WARN, __VA_ARGS__)
#define HLOG_INFO(...) hlog(HLOG_LEVEL_INFO, __VA_ARGS__)
#define HLOG_DEBUG(...) hlog(HLOG_LEVEL_DEBUG, __VA_ARGS__)

#endif
