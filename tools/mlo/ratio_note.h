/*
 * ratio_note.h — what a ratio of an offloaded run's time to the
 * all-resident run's means when it is below 1 (issue 43).  Offload does
 * the same compute plus copies, so "faster than all resident" is the
 * measurement's noise; the note says so next to the ratio, with how much
 * the baseline itself varies when that is known.  No other dependency, so
 * tests/cli/test_ratio_note.c checks the wording directly.
 */
#ifndef MLO_TOOL_RATIO_NOTE_H
#define MLO_TOOL_RATIO_NOTE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
  bool noise;        /* the ratio is below 1.00 (and above 0): noise */
  bool spread_known; /* the baseline's steady prompts (2 or more) give a spread */
  double lo_s, hi_s; /* their fastest and slowest wall time */
  double spread;     /* (hi - lo) / lo: how much the baseline itself varies */
} ratio_note;

/* The note for ratio, given the baseline's per-prompt wall times (walls[0]
 * is the cold prompt; 1.. are the steady ones). */
ratio_note ratio_note_make(double ratio, const double *walls, int nwalls);
/* Writes "; below 1.00 is noise: ..." (or "" when not noise) into buf. */
void ratio_note_text(const ratio_note *n, char *buf, size_t len);

#endif
