/*
 * progress.c — the progress bar for loads, generation and runs.  Drawn on
 * stderr only when stderr is a terminal (and MLO_NO_PROGRESS is unset), so
 * that piped or logged output and --json on stdout never carry it.
 * Redraws at most every 50 ms; progress_finish clears the line.
 */
#include "tool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BAR_WIDTH 30
#define REDRAW_NS 50000000ull

void progress_init(tool_progress *p, const char *label, uint64_t total) {
  memset(p, 0, sizeof *p);
  p->label = label;
  p->total = total;
  p->last_permille = -1;
  const char *off = getenv("MLO_NO_PROGRESS");
  p->enabled = isatty(STDERR_FILENO) && !(off && *off && strcmp(off, "0"));
}

static void draw(tool_progress *p, uint64_t done, uint64_t total) {
  int permille = total ? (int)(done >= total ? 1000 : done * 1000 / total) : 1000;
  char bar[BAR_WIDTH + 1];
  int filled = permille * BAR_WIDTH / 1000;
  for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < filled ? '#' : '.';
  bar[BAR_WIDTH] = '\0';
  fprintf(stderr, "\r  %-10s [%s] %5.1f%%", p->label, bar, permille / 10.0);
  fflush(stderr);
  p->last_permille = permille;
}

void progress_update(tool_progress *p, uint64_t done, uint64_t total) {
  if (!p || !p->enabled) return;
  uint64_t now = mlo_now_ns();
  int permille = total ? (int)(done >= total ? 1000 : done * 1000 / total) : 1000;
  if (permille == p->last_permille) return;
  if (permille < 1000 && now - p->last_ns < REDRAW_NS) return;
  p->last_ns = now;
  draw(p, done, total);
}

void progress_finish(tool_progress *p) {
  if (!p || !p->enabled || p->last_permille < 0) return;
  /* Clear the line so the next output starts clean. */
  fprintf(stderr, "\r%*s\r", BAR_WIDTH + 64, "");
  fflush(stderr);
  p->last_permille = -1;
}

void progress_load_cb(const mlo_component *comp, uint64_t done, uint64_t total, void *user) {
  tool_progress *p = user;
  (void)total;
  if (comp != p->cur_comp) {
    /* A new component: the previous one is complete. */
    p->base += p->cur;
    p->cur = 0;
    p->cur_comp = comp;
  }
  p->cur = done;
  progress_update(p, p->base + p->cur, p->total);
}

void progress_synth_cb(const char *file, uint64_t done, uint64_t total, void *user) {
  (void)file;
  progress_update(user, done, total);
}

static void format_rate(double s_per_it, char *buf, size_t len) {
  if (s_per_it >= 1.0)
    snprintf(buf, len, "%.2f s/it", s_per_it);
  else
    snprintf(buf, len, "%.1f it/s", s_per_it > 0 ? 1.0 / s_per_it : 0.0);
}

void progress_step_cb(size_t done, size_t total, const mlo_component *comp, void *user) {
  tool_progress *p = user;
  if (!p || !p->enabled) return;
  uint64_t now = mlo_now_ns();
  if (!p->t0_ns) p->t0_ns = now; /* set by the caller at the first forward's start */
  if (done < total && now - p->last_ns < REDRAW_NS) return;
  p->last_ns = now;
  double per = done ? (double)(now - p->t0_ns) / 1e9 / (double)done : 0.0;
  char rate[32];
  format_rate(per, rate, sizeof rate);
  fprintf(stderr, "\r  %-9s %zu/%zu  %-16.16s %s, %.2f s left   ", p->label, done, total,
          mlo_component_name(comp), rate, per * (double)(total - done));
  fflush(stderr);
  p->last_permille = (int)(done * 1000 / (total ? total : 1));
}
