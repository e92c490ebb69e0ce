/*
 * topology.c — the node model: what loading a component on every GPU of a
 * node costs, replicated (each GPU copies all of it from the host) or
 * sharded (each copies 1/n, then the GPUs all-gather), from the node's
 * copy paths (mlo_node_topology).  One function serves every place that
 * needs the answer, so they cannot disagree: the host platform paces its
 * stand-in links and gathers by it, `mlo run --ranks auto` and `mlo plan
 * --node` choose the load from it (docs/distributed.md, "Topology").
 *
 * The model is bytes over the narrowest path each way, with every GPU of
 * the node loading at once:
 *  - a GPU's host rate is its link, or its share of the uplink its group
 *    sits behind, whichever is less;
 *  - replicated: the whole component at that rate;
 *  - sharded: 1/n at that rate, then (n-1)/n received from the peers:
 *    over the fabric where there is one; over the host links where there
 *    is none (peers' bytes staged through host memory); and where the
 *    fabric is PCIe peer-to-peer, what comes from another group crosses
 *    this group's uplink too.
 * A whole load overlaps nothing of its slice with its gather; block by
 * block, each piece's gather runs while the next pieces' slices cross the
 * links (src/core/progressive.c), so over a fabric of its own the slower
 * of the two is the time (pipelined_s).
 */
#include "mlo/mlo.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

static bool rate_ok(double r) {
  return isfinite(r) && r >= 0;
}

int mlo_node_plan_loads(const mlo_node_topology *t, unsigned gpus, uint64_t bytes,
                        mlo_load_plan *out) {
  if (!t || !out || t->size < sizeof *t || out->size < offsetof(mlo_load_plan, pipelined_s) ||
      !gpus || gpus > 4096 || !rate_ok(t->link_bps) || !(t->link_bps > 0) ||
      !rate_ok(t->uplink_bps) || !rate_ok(t->fabric_bps))
    return MLO_EINVAL;
  double n = gpus, s = (double)bytes;
  double group = t->group > 1 ? (t->group < gpus ? t->group : gpus) : 1;
  double link = t->link_bps;
  if (t->uplink_bps > 0 && t->uplink_bps / group < link) link = t->uplink_bps / group;

  mlo_load_plan p = {.size = sizeof p, .link_bps = link, .replicated_s = s / link};
  double slice = s / n, incoming = s - slice;
  p.slice_s = slice / link;
  if (gpus == 1) {
    p.gather_s = 0;
  } else if (t->fabric_bps > 0) {
    p.gather_s = incoming / t->fabric_bps;
    /* each group takes in, through its uplink, what its members need from
     * the GPUs outside it */
    if (t->fabric_via_uplinks && t->uplink_bps > 0 && group < n) {
      p.gather_links_s = group * (n - group) * slice / t->uplink_bps;
      if (p.gather_links_s > p.gather_s) p.gather_s = p.gather_links_s;
    }
  } else {
    p.gather_s = p.gather_links_s = incoming / link;
  }
  p.sharded_s = p.slice_s + p.gather_s;
  p.sharded = gpus > 1 && p.sharded_s <= 0.95 * p.replicated_s;
  /* block by block, piece after piece: the gathers overlap the slices
   * where they travel apart (a fabric not through the uplinks) */
  bool apart = t->fabric_bps > 0 && !(t->fabric_via_uplinks && t->uplink_bps > 0 && group < n);
  p.pipelined_s = apart ? fmax(p.slice_s, p.gather_s) : p.sharded_s;
  p.pipelined = gpus > 1 && p.pipelined_s <= 0.95 * p.replicated_s;
  size_t keep = out->size < sizeof p ? out->size : sizeof p; /* an older caller's fields */
  memcpy(out, &p, keep);
  out->size = keep;
  return MLO_OK;
}
