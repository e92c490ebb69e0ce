/*
 * core_topology — the node model (mlo_node_plan_loads, src/base/topology.c)
 * and the host platform's node options: each term of the model on the
 * topologies it must tell apart (a fabric of its own, a shared uplink with
 * PCIe peer-to-peer, no peer path), the 5% rule that keeps near-ties
 * replicated, hostile inputs, and the host platform reporting and pacing
 * what it models (docs/distributed.md, "Topology").
 */
#include "testutil.h"

#include "platform/platform.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define GIB (1024.0 * 1024.0 * 1024.0)

static void assert_near(double got, double want, const char *what) {
  if (!(fabs(got - want) <= 1e-12 * fabs(want) + 1e-15))
    fail_msg("%s: %.17g, expected %.17g", what, got, want);
}

static mlo_load_plan plan(const mlo_node_topology *t, unsigned gpus) {
  mlo_load_plan p = MLO_LOAD_PLAN_INIT;
  assert_status(mlo_node_plan_loads(t, gpus, 1ull << 30, &p), MLO_OK);
  return p;
}

/* 8 GPUs, a host path each, NVLink through NVSwitch: each copies 1/8 and
 * receives 7/8 over the fabric. */
static void test_fabric_of_its_own(void **state) {
  (void)state;
  mlo_node_topology t = {.size = sizeof t, .link_bps = 50e9, .group = 1, .fabric_bps = 360e9};
  mlo_load_plan p = plan(&t, 8);
  assert_near(p.link_bps, 50e9, "link");
  assert_near(p.replicated_s, GIB / 50e9, "replicated");
  assert_near(p.slice_s, GIB / 8 / 50e9, "slice");
  assert_near(p.gather_s, GIB * 7 / 8 / 360e9, "gather");
  assert_near(p.sharded_s, p.slice_s + p.gather_s, "sharded");
  assert_true(p.sharded);
  /* block by block the gathers run under the next pieces' slices: the
   * slower of the two */
  assert_near(p.pipelined_s, p.slice_s > p.gather_s ? p.slice_s : p.gather_s, "pipelined");
  assert_true(p.pipelined);
  assert_near(p.gather_links_s, 0, "a fabric of its own holds no host link");
  /* the fabric does not cross the uplinks: a PCIe flag without an uplink
   * changes nothing */
  t.fabric_via_uplinks = true;
  assert_near(plan(&t, 8).gather_s, GIB * 7 / 8 / 360e9, "gather without an uplink");
}

/* 4 GPUs, two per switch behind one uplink, PCIe peer-to-peer: each GPU
 * gets half the uplink, and what crosses between the groups crosses it. */
static void test_shared_uplink_and_pcie_peers(void **state) {
  (void)state;
  mlo_node_topology t = {.size = sizeof t,
                         .link_bps = 25e9,
                         .group = 2,
                         .uplink_bps = 25e9,
                         .fabric_bps = 20e9,
                         .fabric_via_uplinks = true};
  mlo_load_plan p = plan(&t, 4);
  assert_near(p.link_bps, 12.5e9, "the uplink's share");
  assert_near(p.replicated_s, GIB / 12.5e9, "replicated");
  assert_near(p.slice_s, GIB / 4 / 12.5e9, "slice");
  /* received 3/4 at 20e9 (0.0375 s/GB); across the uplink 2 x 2 slices
   * (0.04 s/GB): the uplink binds */
  assert_near(p.gather_s, 2.0 * 2.0 * (GIB / 4) / 25e9, "gather through the uplinks");
  assert_true(p.sharded);
  /* the gathers cross the uplinks the slices use: nothing overlaps */
  assert_near(p.pipelined_s, p.sharded_s, "pipelined through the uplinks");
  assert_near(p.gather_links_s, p.gather_s, "the uplinks bind: the gather holds them");
  /* the same GPUs each with a host path and the fabric of its own: the
   * receive rate binds instead */
  t.fabric_via_uplinks = false;
  assert_near(plan(&t, 4).gather_s, GIB * 3 / 4 / 20e9, "gather over the fabric");
  /* a group larger than the node is the node */
  t.group = 16;
  assert_near(plan(&t, 2).link_bps, 12.5e9, "group clamped to the GPUs");
}

/* No peer path (GeForce): the peers' bytes cross the host links, so
 * sharding moves what replication does, and a tie stays replicated. */
static void test_no_peer_path(void **state) {
  (void)state;
  mlo_node_topology t = {.size = sizeof t, .link_bps = 12.5e9, .group = 1};
  mlo_load_plan p = plan(&t, 2);
  assert_near(p.gather_s, GIB / 2 / 12.5e9, "gather over the links");
  assert_near(p.sharded_s, p.replicated_s, "sharded = replicated");
  assert_false(p.sharded);
  assert_near(p.pipelined_s, p.sharded_s, "the gathers share the links: nothing pipelines");
  assert_near(p.gather_links_s, p.gather_s, "the whole gather over the links");
  assert_false(p.pipelined);
  p = plan(&t, 1);
  assert_near(p.gather_s, 0, "one GPU gathers nothing");
  assert_false(p.sharded);
}

/* Sharded must save at least 5%: 3% stays replicated, 10% shards. */
static void test_five_percent_rule(void **state) {
  (void)state;
  /* n = 2: sharded/replicated = 1/2 + L/(2F) */
  mlo_node_topology t = {.size = sizeof t, .link_bps = 1e9, .fabric_bps = 1e9 / 0.94}; /* 0.97 */
  mlo_load_plan p = plan(&t, 2);
  assert_near(p.sharded_s / p.replicated_s, 0.97, "ratio");
  assert_false(p.sharded);
  t.fabric_bps = 1e9 / 0.8; /* 0.90 */
  assert_true(plan(&t, 2).sharded);
}

static void test_hostile_inputs(void **state) {
  (void)state;
  const mlo_node_topology good = {.size = sizeof good, .link_bps = 1e9, .fabric_bps = 1e10};
  mlo_load_plan p, before;
  memset(&before, 0x5a, sizeof before);
  struct {
    mlo_node_topology t;
    unsigned gpus;
  } bad[] = {
      {good, 0},
      {good, 4097},
      {{.size = sizeof good, .link_bps = 0}, 2},
      {{.size = sizeof good, .link_bps = NAN}, 2},
      {{.size = sizeof good, .link_bps = INFINITY}, 2},
      {{.size = sizeof good, .link_bps = -1e9}, 2},
      {{.size = sizeof good, .link_bps = 1e9, .uplink_bps = -1}, 2},
      {{.size = sizeof good, .link_bps = 1e9, .uplink_bps = NAN}, 2},
      {{.size = sizeof good, .link_bps = 1e9, .fabric_bps = INFINITY}, 2},
      {{.size = 0, .link_bps = 1e9}, 2}, /* not from MLO_NODE_TOPOLOGY_INIT */
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    p = before;
    if (mlo_node_plan_loads(&bad[i].t, bad[i].gpus, 1, &p) != MLO_EINVAL)
      fail_msg("case %zu: not refused", i);
    assert_memory_equal(&p, &before, sizeof p);
  }
  p = (mlo_load_plan){.size = 8};
  assert_status(mlo_node_plan_loads(&good, 2, 1, &p), MLO_EINVAL); /* shorter than any plan */
  /* a caller built before the pipelined fields: its fields filled, nothing
   * written past them */
  struct {
    mlo_load_plan p;
    unsigned char guard[32];
  } older;
  memset(&older, 0xa5, sizeof older);
  older.p.size = offsetof(mlo_load_plan, pipelined_s);
  assert_status(mlo_node_plan_loads(&good, 2, 1, &older.p), MLO_OK);
  assert_int_equal(older.p.size, offsetof(mlo_load_plan, pipelined_s));
  assert_true(older.p.replicated_s > 0);
  const unsigned char *tail =
      (const unsigned char *)&older.p + offsetof(mlo_load_plan, pipelined_s);
  for (size_t i = 0; i < sizeof older - offsetof(mlo_load_plan, pipelined_s); i++)
    assert_int_equal(tail[i], 0xa5);
  p = (mlo_load_plan)MLO_LOAD_PLAN_INIT;
  assert_status(mlo_node_plan_loads(NULL, 2, 1, &p), MLO_EINVAL);
  assert_status(mlo_node_plan_loads(&good, 2, 1, NULL), MLO_EINVAL);
  assert_status(mlo_node_plan_loads(&good, 4096, UINT64_MAX, &p), MLO_OK);
  assert_true(isfinite(p.sharded_s) && p.sharded_s > 0);
}

/* The host platform reports what its node options model, and nothing
 * where it has none; bad options name themselves. */
static void test_host_node_options(void **state) {
  (void)state;
  char err[512] = "";
  mlo_platform *plat = NULL;
  mlo_node_topology t = MLO_NODE_TOPOLOGY_INIT;
  assert_status(mlo_platform_open("host:bw=2e8", &plat, err, sizeof err), MLO_OK);
  assert_status(mlo_platform_get_topology(plat, &t), MLO_EUNSUPPORTED);
  mlo_platform_close(plat);

  assert_status(mlo_platform_open("host:bw=2e8,group=2,uplink=3e8,fabric=1440000000,pcie_p2p=1",
                                  &plat, err, sizeof err),
                MLO_OK);
  assert_status(mlo_platform_get_topology(plat, &t), MLO_OK);
  assert_near(t.link_bps, 2e8, "link");
  assert_int_equal(t.group, 2);
  assert_near(t.uplink_bps, 3e8, "uplink");
  assert_near(t.fabric_bps, 1.44e9, "fabric");
  assert_true(t.fabric_via_uplinks);
  assert_non_null(strstr(mlo_platform_description(plat), "2 per uplink"));
  mlo_platform_close(plat);

  assert_status(mlo_platform_open("host:bw=2e8,fabric=0", &plat, err, sizeof err), MLO_OK);
  assert_status(mlo_platform_get_topology(plat, &t), MLO_OK);
  assert_near(t.fabric_bps, 0, "no peer path");
  assert_non_null(strstr(mlo_platform_description(plat), "no peer path"));
  mlo_platform_close(plat);

  static const struct {
    const char *spec, *needle;
  } bad[] = {
      {"host:bw=2e8,group=0", "group=0"},
      {"host:bw=2e8,group=x", "group=x"},
      {"host:bw=2e8,group=5000", "group"},
      {"host:bw=2e8,uplink=0", "uplink=0"},
      {"host:bw=2e8,uplink=12", "uplink=12"},
      {"host:bw=2e8,fabric=12", "fabric=12"},
      {"host:bw=2e8,fabric=-1", "fabric=-1"},
      {"host:bw=2e8,pcie_p2p=2", "pcie_p2p"},
      {"host:bw=2e8,pcie_p2p=1", "fabric="},
      {"host:group=2", "bw="},
      {"host:fabric=1e9", "bw="},
      {"host:bw=2e8,uplink=1e30", "1e15"},
      {"host:bw=2e8,fabric=2e8,pcie_p2p=1", "uplink="},
      {"host:bw=2e8,group=2,uplink=1e6", "below 1e6"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    plat = (mlo_platform *)&plat;
    err[0] = '\0';
    int rc = mlo_platform_open(bad[i].spec, &plat, err, sizeof err);
    if (rc != MLO_EINVAL || !strstr(err, bad[i].needle))
      fail_msg("%s -> %s \"%s\", expected MLO_EINVAL naming %s", bad[i].spec, mlo_err_name(rc), err,
               bad[i].needle);
    assert_null(plat);
  }
  assert_status(mlo_platform_get_topology(NULL, &t), MLO_EINVAL);
  t.size = 0; /* not from MLO_NODE_TOPOLOGY_INIT */
  assert_status(mlo_platform_open("host:bw=2e8,fabric=1e9", &plat, err, sizeof err), MLO_OK);
  assert_status(mlo_platform_get_topology(plat, &t), MLO_EINVAL);
  mlo_platform_close(plat);
}

/* The host platform holds a gather to the modelled fabric and its copies
 * to the uplink's share: never sooner (lower bounds only, which no load on
 * the machine can break); and a gather not at all without a model. */
static void test_host_gather_pace(void **state) {
  (void)state;
  char err[512] = "";
  mlo_platform *plat = NULL;
  /* 4 ranks of 1 MiB at 1e8 B/s: 3 MiB received in 31.5 ms */
  assert_status(mlo_platform_open("host:bw=1e8,fabric=1e8", &plat, err, sizeof err), MLO_OK);
  uint64_t t0 = mlo_now_ns();
  mlo_plat_gather_pace(plat, 1u << 20, 4, t0);
  uint64_t took = mlo_now_ns() - t0;
  if (took < (uint64_t)(3.0 * (1 << 20) / 1e8 * 1e9))
    fail_msg("the paced gather returned after %.1f ms, before the modelled 31.5 ms",
             (double)took / 1e6);
  mlo_platform_close(plat);
  /* its copies are held to its share of the uplink: 2 MiB at half of
   * 1e8 B/s take 42 ms, where the link alone would take 21 */
  assert_status(mlo_platform_open("host:bw=1e8,group=2,uplink=1e8", &plat, err, sizeof err),
                MLO_OK);
  size_t bytes = 2u << 20;
  void *block = NULL, *src = calloc(1, bytes);
  assert_non_null(src);
  assert_status(mlo_plat_dev_alloc(plat, bytes, &block), MLO_OK);
  t0 = mlo_now_ns();
  assert_status(mlo_plat_copy_h2d(plat, block, 0, src, bytes), MLO_OK);
  assert_status(mlo_plat_synchronize(plat), MLO_OK);
  took = mlo_now_ns() - t0;
  if (took < (uint64_t)((double)bytes / 5e7 * 1e9))
    fail_msg("2 MiB copied in %.1f ms: faster than the uplink's share allows (42 ms)",
             (double)took / 1e6);
  mlo_plat_dev_free(plat, block, bytes);
  free(src);
  mlo_platform_close(plat);
  /* without node options the gather is what MPI makes it: no wait, even
   * for a gather that a model would hold for an hour */
  assert_status(mlo_platform_open("host:bw=1e6", &plat, err, sizeof err), MLO_OK);
  t0 = mlo_now_ns();
  mlo_plat_gather_pace(plat, (size_t)1 << 40, 4, t0);
  assert_true(mlo_now_ns() - t0 < 60ull * 1000000000ull);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fabric_of_its_own), cmocka_unit_test(test_shared_uplink_and_pcie_peers),
      cmocka_unit_test(test_no_peer_path),      cmocka_unit_test(test_five_percent_rule),
      cmocka_unit_test(test_hostile_inputs),    cmocka_unit_test(test_host_node_options),
      cmocka_unit_test(test_host_gather_pace),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
