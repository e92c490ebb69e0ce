/*
 * ratio_note.c — the note beside a ratio below 1 against all resident
 * (ratio_note.h).
 */
#include "ratio_note.h"

#include <stdio.h>

ratio_note ratio_note_make(double ratio, const double *walls, int nwalls) {
  ratio_note n = {0};
  /* the ratio is printed with two decimals: below 1 is what reads below 1.00 */
  n.noise = ratio > 0 && ratio < 0.995;
  if (nwalls >= 3) {
    n.lo_s = n.hi_s = walls[1];
    for (int i = 2; i < nwalls; i++) {
      if (walls[i] < n.lo_s) n.lo_s = walls[i];
      if (walls[i] > n.hi_s) n.hi_s = walls[i];
    }
    n.spread_known = n.lo_s > 0;
    n.spread = n.spread_known ? (n.hi_s - n.lo_s) / n.lo_s : 0;
  }
  return n;
}

void ratio_note_text(const ratio_note *n, char *buf, size_t len) {
  if (!len) return;
  buf[0] = '\0';
  if (!n->noise) return;
  if (n->spread_known)
    snprintf(buf, len,
             "; below 1.00 is noise (offload does the same compute plus copies): all "
             "resident's own steady prompts took %.3f-%.3f s, %.0f%% apart",
             n->lo_s, n->hi_s, 100.0 * n->spread);
  else
    snprintf(buf, len,
             "; below 1.00 is noise (offload does the same compute plus copies): one "
             "measurement cannot tell by how much; --prompts 4 gives a steady state");
}
