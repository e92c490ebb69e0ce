/*
 * timeline_svg.c — the residency timeline picture of a run (`--timeline`,
 * and what `mlo demo` writes): one row per component with a bar for each
 * time it was resident (the loading part hatched darker, forwards as dark
 * ticks, loads that read from disk in purple), the component's name on the
 * row and on its bars, and below it the device-memory curve scaled to the
 * run (its peak or its budget, whichever is higher: a stand-in device's
 * capacity may be a hundred times either), with a time axis under each
 * part that spans the whole run, and each prompt's start marked across
 * both.  Above: a title, a line naming platform, offload mode, steps and
 * wall time, and a legend of the marks, wrapped to the picture's width.  A
 * plain SVG with no scripts or external references, readable in any
 * browser; the tests render it (tests/cli/test_cli.py, TimelineTests).
 */
#include "tool.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define W 1000.0
#define LEFT 170.0
#define RIGHT 30.0
#define TOP 104.0 /* title, subtitle and two lines of legend above the rows */
#define DISK_FILL "#8e44ad"
#define PROMPT_STROKE "#7f8c8d"
#define BUDGET_STROKE "#e67e22"
#define ROW_H 26.0
#define ROW_GAP 8.0
#define MEM_H 170.0

typedef struct {
  char *buf;
  size_t len, cap;
  bool oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) TOOL_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...) {
  if (b->oom) return;
  if (!b->buf) {
    b->buf = malloc(4096);
    if (!b->buf) {
      b->oom = true;
      return;
    }
    b->cap = 4096;
  }
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->oom = true;
      return;
    }
    if ((size_t)n < b->cap - b->len) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap * 2 + (size_t)n + 1;
    char *grown = realloc(b->buf, cap);
    if (!grown) {
      b->oom = true;
      return;
    }
    b->buf = grown;
    b->cap = cap;
  }
}

/* XML-escapes a name (component names come from files: hostile). */
static void sb_text(sbuf *b, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '&':
      sb_printf(b, "&amp;");
      break;
    case '<':
      sb_printf(b, "&lt;");
      break;
    case '>':
      sb_printf(b, "&gt;");
      break;
    case '"':
      sb_printf(b, "&quot;");
      break;
    case '\'':
      sb_printf(b, "&apos;");
      break;
    default:
      if ((unsigned char)*s >= 0x20) sb_printf(b, "%c", *s); /* control chars are not XML */
    }
  }
}

static const char *role_fill(mlo_role r) {
  switch (r) {
  case MLO_ROLE_DIT:
    return "#f4a259";
  case MLO_ROLE_ENCODER:
    return "#5b8e7d";
  case MLO_ROLE_VAE:
    return "#8cb369";
  default:
    return "#a0a0a0";
  }
}

typedef struct {
  uint64_t t0, t1; /* time span of the picture */
  double plot_w;
} frame;

static double xpos(const frame *f, uint64_t t) {
  double span = (double)(f->t1 - f->t0);
  return LEFT + (span > 0 ? (double)(t - f->t0) / span : 0) * f->plot_w;
}

/* A "nice" tick step (1, 2 or 5 x 10^k) giving about `want` ticks. */
static double nice_step(double range, int want) {
  double raw = range / want, p = 1;
  while (p * 10 <= raw) p *= 10;
  while (p > raw) p /= 10;
  if (p * 5 <= raw) return p * 5;
  if (p * 2 <= raw) return p * 2;
  return p;
}

/* Whether a component's loads read its slab from its checkpoint files (the
 * disk tier keeps it there: --host-memory). */
static bool reads_from_disk(mlo_component *c) {
  mlo_component_stats st;
  return mlo_component_get_stats(c, &st) == MLO_OK && st.disk_loads > 0;
}

static void draw_bar(sbuf *b, const frame *f, mlo_component *c, double y, uint64_t begin,
                     uint64_t loaded, uint64_t end, bool prefetch) {
  double x0 = xpos(f, begin), x1 = xpos(f, end), xl = xpos(f, loaded);
  if (x1 - x0 < 1) x1 = x0 + 1;
  sb_printf(b, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='%s' rx='3'/>\n", x0, y,
            x1 - x0, ROW_H, role_fill(mlo_component_role(c)));
  if (xl > x0) /* a prefetch's copy in blue: it overlaps other work */
    sb_printf(b,
              "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='%s' "
              "fill-opacity='%s'><title>%s</title></rect>\n",
              x0, y, xl - x0, ROW_H, prefetch ? "#2f5d9b" : "#000", prefetch ? "0.85" : "0.25",
              prefetch ? "prefetch (copy ahead of use)" : "loading");
  if (xl > x0 && reads_from_disk(c)) /* the load's top half: its bytes came from disk */
    sb_printf(b,
              "<rect class='disk' x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='%s'>"
              "<title>load read from disk</title></rect>\n",
              x0, y, xl - x0 < 2 ? 2 : xl - x0, ROW_H / 2, DISK_FILL);
  const char *name = mlo_component_name(c);
  if (x1 - x0 > 7.0 * (double)strlen(name) + 8) {
    sb_printf(b, "<text x='%.1f' y='%.1f' font-size='12' fill='#111'>", x0 + 4, y + ROW_H / 2 + 4);
    sb_text(b, name);
    sb_printf(b, "</text>\n");
  }
}

/* One component's row: residency bars (LOAD_BEGIN .. EVICT), then the
 * forwards on top of them. */
static void draw_row(sbuf *b, const frame *f, const tool_trace *t, mlo_component *c, double y) {
  sb_printf(b, "<text x='%.1f' y='%.1f' font-size='12' text-anchor='end'>", LEFT - 8,
            y + ROW_H / 2 - 1);
  sb_text(b, mlo_component_name(c));
  sb_printf(b,
            "</text>\n<text x='%.1f' y='%.1f' font-size='10' fill='#555' text-anchor='end'>"
            "%s, %s</text>\n",
            LEFT - 8, y + ROW_H / 2 + 10, mlo_role_name(mlo_component_role(c)),
            tool_size(mlo_component_bytes(c)));
  bool open = false, prefetch = false;
  uint64_t begin = 0, loaded = 0, fwd = 0;
  for (size_t i = 0; i < t->count; i++) {
    const mlo_trace_event *ev = &t->events[i];
    if (ev->comp != c) continue;
    if (ev->kind == MLO_TRACE_LOAD_BEGIN && !open) {
      open = true;
      prefetch = false;
      begin = loaded = ev->t_ns;
    } else if (ev->kind == MLO_TRACE_PREFETCH && open) {
      prefetch = true;
    } else if (ev->kind == MLO_TRACE_LOAD_END && open) {
      loaded = ev->t_ns;
    } else if (ev->kind == MLO_TRACE_EVICT && open) {
      draw_bar(b, f, c, y, begin, loaded, ev->t_ns, prefetch);
      open = false;
    }
  }
  if (open) draw_bar(b, f, c, y, begin, loaded, f->t1, prefetch);
  for (size_t i = 0; i < t->count; i++) {
    const mlo_trace_event *ev = &t->events[i];
    if (ev->comp != c) continue;
    if (ev->kind == MLO_TRACE_FORWARD_BEGIN) {
      fwd = ev->t_ns;
    } else if (ev->kind == MLO_TRACE_BLOCK_LOAD) { /* a streamed block's copy issued */
      sb_printf(b,
                "<rect x='%.1f' y='%.1f' width='1.5' height='6' fill='#2f5d9b'><title>block "
                "copy issued, %s</title></rect>\n",
                xpos(f, ev->t_ns), y, tool_size(ev->bytes));
    } else if (ev->kind == MLO_TRACE_FORWARD_END) {
      double x0 = xpos(f, fwd), x1 = xpos(f, ev->t_ns);
      sb_printf(b,
                "<rect x='%.1f' y='%.1f' width='%.1f' height='5' fill='#222' "
                "stroke='#fff' stroke-width='0.5'><title>forward</title></rect>\n",
                x0, y + ROW_H - 5, x1 - x0 < 1 ? 1 : x1 - x0);
    }
  }
}

static void draw_time_axis(sbuf *b, const frame *f, double y) {
  double span_s = (double)(f->t1 - f->t0) / 1e9, step = nice_step(span_s > 0 ? span_s : 1, 8);
  /* what the axis spans, for a reader of the file (the tests) */
  sb_printf(b,
            "<line class='time-axis' data-end-s='%.6f' x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' "
            "stroke='#333'/>\n",
            span_s, LEFT, y, LEFT + f->plot_w, y);
  for (double s = 0; s <= span_s + step * 1e-9; s += step) {
    double x = LEFT + (span_s > 0 ? s / span_s : 0) * f->plot_w;
    sb_printf(b, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#333'/>\n", x, y, x, y + 5);
    sb_printf(b, "<text x='%.1f' y='%.1f' font-size='11' text-anchor='middle'>%g</text>\n", x,
              y + 18, s);
  }
  sb_printf(b, "<text x='%.1f' y='%.1f' font-size='12' text-anchor='middle'>time (s)</text>\n",
            LEFT + f->plot_w / 2, y + 34);
}

/* A dashed level across the memory chart, labelled at its right end. */
static void draw_level(sbuf *b, const frame *f, double y, const char *colour, const char *label,
                       uint64_t bytes) {
  sb_printf(b,
            "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='%s' stroke-dasharray='6 4'/>\n",
            LEFT, y, LEFT + f->plot_w, y, colour);
  sb_printf(b, "<text x='%.1f' y='%.1f' font-size='11' fill='%s' text-anchor='end'>%s %s</text>\n",
            LEFT + f->plot_w - 4, y - 4, colour, label, tool_size(bytes));
}

static void draw_memory(sbuf *b, const frame *f, const tool_trace *t, const tool_timeline_run *run,
                        double y0) {
  uint64_t peak = 0, capacity = run->capacity;
  for (size_t i = 0; i < t->count; i++)
    if (t->events[i].device_bytes > peak) peak = t->events[i].device_bytes;
  /* Scaled to the run: its peak, and its budget and the capacity where
   * they are near it (within 1.5x); farther ones are said, not drawn: a
   * stand-in device's 8 GiB would flatten an 80 MiB run into a line. */
  double top = (double)peak * 1.1;
  bool budget_shown = run->budget && (double)run->budget <= (double)peak * 1.5;
  bool capacity_shown = capacity && (double)capacity <= (double)peak * 1.5;
  if (budget_shown && (double)run->budget > top) top = (double)run->budget;
  if (capacity_shown && (double)capacity > top) top = (double)capacity;
  if (top <= 0) top = 1;
  double ybase = y0 + MEM_H;
#define YMEM(v) (ybase - (double)(v) / top * MEM_H)
  sb_printf(b, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#333'/>\n", LEFT, y0, LEFT,
            ybase);
  /* Ticks at round numbers of the binary unit the labels use. */
  double unit = 1;
  while (unit * 1024 <= top) unit *= 1024;
  double step = nice_step(top / unit, 4) * unit;
  for (double v = 0; v <= top + 1; v += step) {
    sb_printf(b, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#ddd'/>\n", LEFT, YMEM(v),
              LEFT + f->plot_w, YMEM(v));
    sb_printf(b, "<text x='%.1f' y='%.1f' font-size='11' text-anchor='end'>%s</text>\n", LEFT - 6,
              YMEM(v) + 4, tool_size((uint64_t)v));
  }
  sb_printf(b,
            "<text x='20' y='%.1f' font-size='12' transform='rotate(-90 20 %.1f)' "
            "text-anchor='middle'>device memory</text>\n",
            y0 + MEM_H / 2, y0 + MEM_H / 2);
  if (capacity_shown) draw_level(b, f, YMEM(capacity), "#c0392b", "capacity", capacity);
  if (budget_shown && run->budget != capacity)
    draw_level(b, f, YMEM(run->budget), BUDGET_STROKE, "budget", run->budget);
  char above[160] = "";
  if (run->budget && !budget_shown)
    snprintf(above, sizeof above, "budget %s", tool_size(run->budget));
  if (capacity && !capacity_shown && run->budget != capacity) {
    size_t len = strlen(above);
    snprintf(above + len, sizeof above - len, "%scapacity %s", len ? ", " : "",
             tool_size(capacity));
  }
  if (above[0])
    sb_printf(b,
              "<text x='%.1f' y='%.1f' font-size='11' fill='#c0392b'>%s: above the scale</text>\n",
              LEFT + 6, y0 + 26, above);
  sb_printf(b, "<polyline fill='none' stroke='#2c6fbb' stroke-width='2' points='%.1f,%.1f", LEFT,
            ybase);
  uint64_t cur = 0;
  for (size_t i = 0; i < t->count; i++) {
    const mlo_trace_event *ev = &t->events[i];
    /* Memory changes at loads (the block is allocated) and evictions only;
     * a LOAD_END is stamped with the copy's end, earlier than it is emitted. */
    if (ev->kind != MLO_TRACE_LOAD_BEGIN && ev->kind != MLO_TRACE_EVICT) continue;
    double x = xpos(f, ev->t_ns);
    sb_printf(b, " %.1f,%.1f %.1f,%.1f", x, YMEM(cur), x, YMEM(ev->device_bytes));
    cur = ev->device_bytes;
  }
  sb_printf(b, " %.1f,%.1f'/>\n", LEFT + f->plot_w, YMEM(cur));
  sb_printf(b, "<text x='%.1f' y='%.1f' font-size='11' fill='#2c6fbb'>peak %s</text>\n", LEFT + 6,
            y0 + 12, tool_size(peak));
#undef YMEM
}

/* Each prompt's start: a dashed line from the rows' top to the memory
 * chart's foot, numbered at the top. */
static void draw_prompts(sbuf *b, const frame *f, const tool_timeline_run *run, double y0,
                         double y1) {
  for (int p = 0; p < run->nprompts; p++) {
    double x = xpos(f, run->prompt_ns[p]);
    sb_printf(b,
              "<line class='prompt' x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='%s' "
              "stroke-width='1.5' stroke-dasharray='3 3'/>\n",
              x, y0 - 6, x, y1, PROMPT_STROKE);
    sb_printf(b, "<text x='%.1f' y='%.1f' font-size='10' fill='%s'>prompt %d</text>\n", x + 3,
              y0 - 8, PROMPT_STROKE, p + 1);
  }
}

/* What the marks mean, wrapped to the picture's width so no key is cut. */
static void draw_legend(sbuf *b, double y) {
  static const struct {
    const char *label, *fill, *opacity;
    double h;
  } keys[] = {
      {"resident: DiT", "#f4a259", "1", 12},
      {"encoder", "#5b8e7d", "1", 12},
      {"VAE", "#8cb369", "1", 12},
      {"loading (copy in flight)", "#000", "0.25", 12},
      {"prefetch (copy ahead of use)", "#2f5d9b", "0.85", 12},
      {"load read from disk", DISK_FILL, "1", 6},
      {"streamed block's copy issued", "#2f5d9b", "1", 6},
      {"forward", "#222", "1", 5},
      {"prompt starts", PROMPT_STROKE, "1", 12},
      {"budget", BUDGET_STROKE, "1", 2},
  };
  const double x_start = 20, x_end = W - RIGHT, char_w = 6.5;
  double x = x_start;
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    double width = 18 + char_w * (double)strlen(keys[i].label);
    if (x > x_start && x + width > x_end) x = x_start, y += 16;
    bool line = !strcmp(keys[i].label, "prompt starts");
    sb_printf(b,
              "<rect class='legend' x='%.1f' y='%.1f' width='%.0f' height='%.0f' fill='%s' "
              "fill-opacity='%s' stroke='#999' stroke-width='0.5'/>\n",
              x + (line ? 6 : 0), y - keys[i].h, line ? 2.0 : 14.0, keys[i].h, keys[i].fill,
              keys[i].opacity);
    sb_printf(b, "<text class='legend' x='%.1f' y='%.1f' font-size='11'>%s</text>\n", x + 18, y - 1,
              keys[i].label);
    x += width + 18;
  }
}

int tool_timeline_write_svg(const tool_trace *t, mlo_pipeline *pipe, const tool_timeline_run *run,
                            const char *title, const char *subtitle, const char *path, char *err,
                            size_t errlen) {
  size_t ncomp = mlo_pipeline_component_count(pipe);
  /* The whole run: from its start (or the first event) to its end (or the
   * last event stamped: a copy's end is stamped when it lands, which may
   * be after events recorded later) */
  frame f = {run->start_ns, run->end_ns, W - LEFT - RIGHT};
  for (size_t i = 0; i < t->count; i++) {
    if (!f.t0 || t->events[i].t_ns < f.t0) f.t0 = t->events[i].t_ns;
    if (t->events[i].t_ns > f.t1) f.t1 = t->events[i].t_ns;
  }
  if (f.t1 <= f.t0) f.t1 = f.t0 + 1;
  double rows_h = (double)ncomp * (ROW_H + ROW_GAP);
  double axis_y = TOP + rows_h + 4, mem_y = axis_y + 60;
  double height = mem_y + MEM_H + 50; /* a second time axis under the memory chart */
  sbuf b = {0};
  sb_printf(&b,
            "<?xml version='1.0' encoding='UTF-8'?>\n"
            "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' "
            "viewBox='0 0 %.0f %.0f' font-family='sans-serif'>\n"
            "<rect width='100%%' height='100%%' fill='#fff'/>\n"
            "<text x='%.1f' y='26' font-size='16' font-weight='bold'>",
            W, height, W, height, LEFT);
  sb_text(&b, title ? title : "mlo residency timeline");
  sb_printf(&b, "</text>\n");
  if (subtitle) {
    sb_printf(&b, "<text x='%.1f' y='48' font-size='12' fill='#333'>", LEFT);
    sb_text(&b, subtitle);
    sb_printf(&b, "</text>\n");
  }
  draw_legend(&b, 70);
  for (size_t i = 0; i < ncomp; i++)
    draw_row(&b, &f, t, mlo_pipeline_component_at(pipe, i), TOP + (double)i * (ROW_H + ROW_GAP));
  draw_time_axis(&b, &f, axis_y);
  draw_memory(&b, &f, t, run, mem_y);
  draw_time_axis(&b, &f, mem_y + MEM_H);
  draw_prompts(&b, &f, run, TOP, mem_y + MEM_H);
  sb_printf(&b, "</svg>\n");
  int rc;
  if (b.oom) {
    snprintf(err, errlen, "out of memory drawing the timeline");
    rc = MLO_ENOMEM;
  } else {
    rc = tool_write_file(path, b.buf, b.len, err, errlen);
  }
  free(b.buf);
  return rc;
}
