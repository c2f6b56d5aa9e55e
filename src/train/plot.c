/* plot.c — a run's loss curve (train_plot): the log's training and
 * evaluation losses by step, drawn by gnuplot (Debian's gnuplot-nox) to SVG
 * and PNG, as the serving benchmark's plot is. The script goes to gnuplot as
 * a file of its own with the points inline; gnuplot missing or failing is an
 * error the run reports and goes on from. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "train/train.h"

extern char **environ;

/* s as a gnuplot single-quoted string ('' inside stands for '). */
static void quoted(hbuf *b, const char *s) {
  hbuf_putc(b, '\'');
  for (; *s; s++) {
    if (*s == '\'') hbuf_putc(b, '\'');
    if (*s != '\n' && *s != '\r') hbuf_putc(b, *s);
  }
  hbuf_putc(b, '\'');
}

int train_plot(const char *log_path, const char *png_path, const char *svg_path, const char *title, herr *err) {
  char *text = NULL;
  size_t len = 0;
  int rc = hfile_read(log_path, &text, &len, err);
  if (rc) return rc;
  hbuf tr = {0}, ev = {0}, gp = {0};
  int64_t ntr = 0, nev = 0;
  for (char *s = text; s < text + len;) {
    char *e = memchr(s, '\n', (size_t)(text + len - s));
    size_t n = e ? (size_t)(e - s) : (size_t)(text + len - s);
    json_t *o = json_loadb(s, n, 0, NULL);
    const json_t *step = json_object_get(o, "step"), *l = json_object_get(o, "loss"), *el = json_object_get(o, "eval_loss");
    if (json_is_integer(step) && json_is_number(l)) hbuf_printf(&tr, "%lld %.9g\n", (long long)json_integer_value(step), json_number_value(l)), ntr++;
    if (json_is_integer(step) && json_is_number(el)) hbuf_printf(&ev, "%lld %.9g\n", (long long)json_integer_value(step), json_number_value(el)), nev++;
    json_decref(o);
    s += n + (e ? 1 : 0);
  }
  free(text);
  if (!ntr) {
    hbuf_free(&tr), hbuf_free(&ev);
    return herr_set(err, HEARTH_EINVAL, "%s: no training steps to draw", log_path);
  }
  hbuf_printf(&gp, "$train << EOD\n%sEOD\n", hbuf_str(&tr));
  if (nev) hbuf_printf(&gp, "$eval << EOD\n%sEOD\n", hbuf_str(&ev));
  hbuf_puts(&gp, "set title ");
  quoted(&gp, title);
  hbuf_puts(&gp, " noenhanced\nset xlabel 'step'\nset ylabel 'loss'\nset grid\nset key top right\n"
                 "set terminal svg size 900,500 font 'sans,11' background rgb 'white'\nset output ");
  quoted(&gp, svg_path);
  hbuf_printf(&gp, "\nplot $train using 1:2 with %s lw 2 lc rgb '#1f77b4' title 'training loss'", ntr > 1 ? "lines" : "points pt 7");
  if (nev) hbuf_puts(&gp, ", $eval using 1:2 with linespoints pt 7 lw 2 lc rgb '#d62728' title 'evaluation loss'");
  hbuf_puts(&gp, "\nset output\n"
                 "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 900,500 font 'sans,10' } "
                 "else { set terminal png size 900,500 }\nset output ");
  quoted(&gp, png_path);
  hbuf_puts(&gp, "\nreplot\nset output\n");
  hbuf_free(&tr), hbuf_free(&ev);
  if (gp.oom) {
    hbuf_free(&gp);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  char script[] = "/tmp/hearth-plot-XXXXXX", errs[] = "/tmp/hearth-plot-err-XXXXXX";
  int fd = mkstemp(script), efd = fd >= 0 ? mkstemp(errs) : -1;
  if (fd < 0 || efd < 0 || write(fd, gp.data, gp.len) != (ssize_t)gp.len) {
    rc = herr_set(err, HEARTH_EIO, "cannot write gnuplot's script in /tmp");
  } else {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, efd, 2);
    char *argv[] = {"gnuplot", script, NULL};
    pid_t pid;
    int e = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    int status = 0;
    if (e == ENOENT) {
      rc = herr_set(err, HEARTH_ENOTFOUND, "gnuplot is not installed (Debian: apt-get install gnuplot-nox)");
    } else if (e) {
      rc = herr_set(err, HEARTH_EIO, "cannot run gnuplot: %s", strerror(e));
    } else if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      char msg[300] = "";
      ssize_t k = pread(efd, msg, sizeof msg - 1, 0);
      msg[k > 0 ? k : 0] = 0;
      char *nl = strchr(msg, '\n');
      if (nl && nl[1]) nl = strchr(nl + 1, '\n'); /* two lines: gnuplot's message and its caret */
      if (nl) *nl = 0;
      rc = herr_set(err, HEARTH_EIO, "gnuplot failed: %s", msg[0] ? msg : "no message");
    }
  }
  if (fd >= 0) close(fd), unlink(script);
  if (efd >= 0) close(efd), unlink(errs);
  hbuf_free(&gp);
  return rc;
}
