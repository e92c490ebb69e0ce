/*
 * race_sweep — thousands of randomized schedules of threads against one
 * pipeline, each checked for content and residency (docs/reliability.md).
 *
 * A race that corrupts an image shows up only under some interleavings, so
 * one fixed schedule proves little.  Each schedule here draws, from its own
 * seed: a pipeline (1-2 encoders, 1-3 DiTs, maybe a VAE, an OTHER, an empty
 * component, mutable buffers, tied tensors; declared in random order), a
 * host device whose capacity is either exactly what offload needs or less
 * (forcing eviction, or out-of-memory), random copy delays (jitter), a sync
 * mode, and 2-4 threads that forward, acquire/hold/release, try_acquire and
 * nest acquires in random order with random pauses; in one schedule in
 * three they also disable and re-enable offload between their calls (while
 * others forward: refused with MLO_EBUSY whenever anything executes).  One
 * schedule in three runs the budget policy instead of strict, with prefetch
 * on or off, a budget anywhere from the largest component to the capacity
 * and a declared schedule the random calls mostly ignore (so the cursor
 * resynchronizes all the time); in half of those the DiTs are declared in
 * blocks and the budget is below the largest of them, so they stream
 * (docs/streaming.md): threads holding the same DiT then run its blocks at
 * once, share slots and wait for them.  Inside every forward the component must be
 * resident with the right bytes, nothing it excludes resident (strict), the
 * audit clean (the budget held, for budget); after each schedule the audit must pass,
 * device accounting match, and every device byte come back at the end.
 *
 * Usage: race_sweep [SCHEDULES [FIRST_SEED]].  A failure names its seed;
 * `race_sweep 1 SEED` replays that schedule.
 */
#include "testutil.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ThreadSanitizer makes each schedule several times slower; a third of
 * the schedules keeps its run (make test-tsan) short. */
static unsigned n_schedules = TU_TSAN ? 1000 : 3000;
static uint64_t first_seed = 1;

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static unsigned below(uint64_t *s, unsigned n) {
  return (unsigned)(splitmix(s) % n);
}

typedef struct {
  char names[TU_MAX_COMPS][16];
  tu_comp_spec specs[TU_MAX_COMPS];
  size_t n;
  bool undersized; /* capacity below what offload needs: OOM allowed */
} layout;

/* A random pipeline, its components in random declaration order. */
static void draw_layout(uint64_t *rng, layout *l) {
  static const mlo_role roles[] = {MLO_ROLE_ENCODER, MLO_ROLE_DIT, MLO_ROLE_VAE, MLO_ROLE_OTHER};
  unsigned count[4] = {1 + below(rng, 2), 1 + below(rng, 3), below(rng, 2), below(rng, 2)};
  l->n = 0;
  for (unsigned r = 0; r < 4; r++)
    for (unsigned i = 0; i < count[r]; i++) {
      tu_comp_spec *s = &l->specs[l->n];
      snprintf(l->names[l->n], sizeof l->names[0], "%s%u", mlo_role_name(roles[r]), i);
      s->name = l->names[l->n];
      s->role = roles[r];
      s->ntensors = 1 + below(rng, 4);
      s->tensor_bytes = 4 * (256 + below(rng, 1792)); /* 1-8 KiB */
      s->nmutable = below(rng, 4) == 0;
      l->n++;
    }
  if (below(rng, 8) == 0) { /* an empty component: no bytes, no platform call (C13) */
    tu_comp_spec *s = &l->specs[l->n];
    snprintf(l->names[l->n], sizeof l->names[0], "empty");
    *s = (tu_comp_spec){l->names[l->n], below(rng, 2) ? MLO_ROLE_DIT : MLO_ROLE_ENCODER, 0, 0, 0};
    l->n++;
  }
  for (size_t i = l->n; i > 1; i--) { /* shuffle; names stay with their specs */
    size_t j = below(rng, (unsigned)i);
    tu_comp_spec t = l->specs[i - 1];
    l->specs[i - 1] = l->specs[j];
    l->specs[j] = t;
  }
}

/* Device bytes offload needs at its peak: VAEs and OTHERs are never evicted
 * while enabled; beside them, either every encoder or the largest DiT.
 * *at_enable gets what enable itself loads (VAEs and encoders). */
static uint64_t offload_need(tu_pipe *tp, uint64_t *at_enable) {
  uint64_t fixed = 0, encoders = 0, dit = 0;
  for (size_t i = 0; i < mlo_pipeline_component_count(tp->pipe); i++) {
    mlo_component *c = mlo_pipeline_component_at(tp->pipe, i);
    uint64_t b = mlo_component_bytes(c);
    switch (mlo_component_role(c)) {
    case MLO_ROLE_ENCODER:
      encoders += b;
      break;
    case MLO_ROLE_DIT:
      dit = b > dit ? b : dit;
      break;
    default:
      fixed += b;
    }
  }
  *at_enable = fixed + encoders; /* OTHERs are counted too: they load on first use */
  return fixed + (encoders > dit ? encoders : dit);
}

typedef struct {
  tu_pipe *tp;
  const layout *l;
  uint64_t rng;
  unsigned ops;
  pthread_barrier_t *start;
  bool toggles; /* this schedule's workers also disable and re-enable */
  bool budget;  /* the budget policy: nested acquires may be refused with EDEADLK */
  const mlo_offload_settings *settings;
  /* outcomes, read after join */
  unsigned forwards, oom, busy, deadlk, toggled;
  char failure[256];
} worker;

static mlo_component *pick(worker *w) {
  size_t n = mlo_pipeline_component_count(w->tp->pipe);
  return mlo_pipeline_component_at(w->tp->pipe, below(&w->rng, (unsigned)n));
}

static bool excludes(mlo_component *a, mlo_component *b) {
  mlo_role x = mlo_component_role(a), y = mlo_component_role(b);
  if (a == b) return false;
  if (x == MLO_ROLE_DIT) return y == MLO_ROLE_DIT || y == MLO_ROLE_ENCODER;
  return x == MLO_ROLE_ENCODER && y == MLO_ROLE_DIT;
}

/* Records a status; false (with the failure noted) when it is not allowed. */
static bool accept(worker *w, int rc, const char *what, mlo_component *c, int also_ok) {
  if (rc == MLO_OK || rc == also_ok) return true;
  /* Out of memory is allowed on an undersized device, and where offload is
   * switched off now and then: unhooked loads evict nothing. */
  if (rc == MLO_ENOMEM_DEVICE && (w->l->undersized || w->toggles)) {
    w->oom++;
    return true;
  }
  snprintf(w->failure, sizeof w->failure, "%s(%s) -> %s: %s", what, mlo_component_name(c),
           mlo_err_name(rc), mlo_pipeline_errmsg(w->tp->pipe));
  return false;
}

/* Hold c (acquire), check it, maybe nest a second acquire, release. */
static bool hold(worker *w, mlo_component *c) {
  int rc = mlo_component_acquire(c);
  if (rc) return accept(w, rc, "acquire", c, MLO_OK);
  bool ok = tu_forward_check(c, w->tp) == 0;
  w->forwards++;
  mlo_component *d = pick(w);
  /* stable while c is held: enable/disable refuse while anything executes */
  bool hooked = mlo_offload_is_enabled(w->tp->pipe);
  if (ok && d != c) {
    rc = mlo_component_acquire(d);
    if (hooked && w->budget && rc == MLO_EDEADLK) { /* no room while this thread holds c */
      w->deadlk++;
    } else if (hooked && !w->budget && excludes(c, d)) { /* a conflicting one: refused, no hang */
      if (rc == MLO_OK) mlo_component_release(d);
      if (rc != MLO_EDEADLK) {
        snprintf(w->failure, sizeof w->failure, "acquire(%s) while holding %s -> %s, not EDEADLK",
                 mlo_component_name(d), mlo_component_name(c), mlo_err_name(rc));
        ok = false;
      }
      w->deadlk++;
    } else if (rc == MLO_OK) {
      ok = tu_forward_check(d, w->tp) == 0 && tu_forward_check(c, w->tp) == 0;
      w->forwards++;
      rc = mlo_component_release(d);
      ok = ok && accept(w, rc, "release", d, MLO_OK);
    } else {
      ok = accept(w, rc, "nested acquire", d, MLO_OK);
    }
  }
  if (below(&w->rng, 2)) sched_yield(); /* hold it across a reschedule */
  rc = mlo_component_release(c);
  return accept(w, rc, "release", c, MLO_OK) && ok;
}

static void *work(void *arg) {
  worker *w = arg;
  pthread_barrier_wait(w->start);
  for (unsigned i = 0; i < w->ops && !w->failure[0]; i++) {
    mlo_component *c = pick(w);
    unsigned op = below(&w->rng, w->toggles ? 9 : 8);
    int rc;
    if (op == 8) { /* off and on again while the others run */
      bool on = mlo_offload_is_enabled(w->tp->pipe);
      rc = on ? mlo_offload_disable(w->tp->pipe) : mlo_offload_enable(w->tp->pipe, w->settings);
      if (rc == MLO_EBUSY)
        w->busy++;
      else if (accept(w, rc, on ? "disable" : "enable", c, MLO_OK) && rc == MLO_OK)
        w->toggled++;
    } else if (op < 5) {
      rc = tu_forward(w->tp, c);
      w->forwards++;
      accept(w, rc, "forward", c, MLO_OK);
    } else if (op < 7) {
      hold(w, c);
    } else {
      rc = mlo_component_try_acquire(c);
      if (rc == MLO_EBUSY) w->busy++;
      if (accept(w, rc, "try_acquire", c, MLO_EBUSY) && rc == MLO_OK) {
        w->forwards += tu_forward_check(c, w->tp) == 0;
        accept(w, mlo_component_release(c), "release", c, MLO_OK);
      }
    }
    for (unsigned spin = below(&w->rng, 3) * 500; spin; spin--) __asm__ volatile("");
  }
  return NULL;
}

typedef struct {
  unsigned schedules, threads, forwards, oom, busy, deadlk, undersized, jitter, device_sync;
  unsigned toggling, toggled; /* schedules with enable/disable in them; toggles that took */
  unsigned enable_refused;    /* undersized below encoders + VAEs: nothing ran */
  unsigned budget;            /* schedules under the budget policy */
  unsigned streamed;          /* of which with DiTs streaming their blocks */
  uint64_t block_loads;       /* streamed blocks copied, in all */
} totals;

/* One schedule; fails the test naming the seed on any violation. */
/* The schedule's device and pipeline: the capacity comes from the layout,
 * so it is measured first on a roomy device. */
static tu_pipe *open_pipe(uint64_t seed, uint64_t *rng, const layout *l, bool jitter) {
  char opts[128];
  snprintf(opts, sizeof opts, "capacity=64M,jitter=0");
  mlo_platform *probe = tu_platform_open(opts);
  tu_pipe *ptp = tu_pipe_build(probe, l->specs, l->n);
  uint64_t at_enable = 0, need = offload_need(ptp, &at_enable);
  tu_pipe_free(ptp);
  mlo_platform_close(probe);
  /* Undersized: short of the peak but, where the DiT sets the peak, enough
   * for enable, so the DiTs' loads are the ones refused. */
  uint64_t capacity = need;
  if (l->undersized) {
    capacity = need - need / (2 + below(rng, 6));
    if (at_enable < need && capacity < at_enable) capacity = at_enable;
    if (capacity == need) capacity--;
  }
  snprintf(opts, sizeof opts, "capacity=%llu,jitter=%d,seed=%llu", (unsigned long long)capacity,
           jitter, (unsigned long long)seed);
  tu_pipe *tp = tu_pipe_build(tu_platform_open(opts), l->specs, l->n);
  tp->audit_in_forward = tp->exclusion_in_forward = true;
  for (size_t i = 0; i < l->n; i++) /* a tied tensor now and then (C6) */
    if (l->specs[i].ntensors > 1 && below(rng, 3) == 0) {
      mlo_component *c = tu_comp(tp, l->specs[i].name);
      tu_add_alias(tp, c, "tied", mlo_component_find_tensor(c, "t0"));
    }
  return tp;
}

/* A schedule in the pipeline's order: each encoder once, each DiT for a
 * few steps, each VAE once. */
static void declare_schedule(tu_pipe *tp, uint64_t *rng) {
  mlo_schedule_entry e[TU_MAX_COMPS];
  size_t n = 0;
  static const mlo_role order[] = {MLO_ROLE_ENCODER, MLO_ROLE_DIT, MLO_ROLE_VAE};
  for (size_t r = 0; r < 3; r++)
    for (size_t i = 0; i < mlo_pipeline_component_count(tp->pipe); i++) {
      mlo_component *c = mlo_pipeline_component_at(tp->pipe, i);
      if (mlo_component_role(c) == order[r])
        e[n++] = (mlo_schedule_entry){c, order[r] == MLO_ROLE_DIT ? 1 + below(rng, 4) : 1};
    }
  assert_ok(mlo_pipeline_set_schedule(tp->pipe, e, n));
}

/* Runs 2-4 workers to completion; returns how many. */
static unsigned run_workers(tu_pipe *tp, const layout *l, uint64_t *rng, uint64_t seed, totals *t,
                            const mlo_offload_settings *s) {
  bool budget = s->policy == MLO_POLICY_BUDGET;
  unsigned nthreads = 2 + below(rng, 3);
  bool toggles = below(rng, 3) == 0;
  worker w[4];
  pthread_t th[4];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, nthreads);
  for (unsigned i = 0; i < nthreads; i++) {
    w[i] = (worker){.tp = tp,
                    .l = l,
                    .rng = splitmix(rng),
                    .ops = 3 + below(rng, 6),
                    .start = &start,
                    .toggles = toggles,
                    .budget = budget,
                    .settings = s};
    assert_int_equal(pthread_create(&th[i], NULL, work, &w[i]), 0);
  }
  for (unsigned i = 0; i < nthreads; i++) {
    pthread_join(th[i], NULL);
    if (w[i].failure[0])
      fail_msg("seed %llu: thread %u: %s", (unsigned long long)seed, i, w[i].failure);
    t->forwards += w[i].forwards;
    t->oom += w[i].oom;
    t->busy += w[i].busy;
    t->deadlk += w[i].deadlk;
    t->toggled += w[i].toggled;
  }
  t->toggling += toggles;
  pthread_barrier_destroy(&start);
  return nthreads;
}

/* One schedule; fails the test naming the seed on any violation. */
static void run_schedule(uint64_t seed, totals *t) {
  uint64_t rng = seed;
  layout l;
  draw_layout(&rng, &l);
  bool jitter = below(&rng, 2);
  mlo_sync_mode sync = below(&rng, 5) == 0 ? MLO_SYNC_DEVICE : MLO_SYNC_EVENT;
  l.undersized = below(&rng, 4) == 0;
  tu_pipe *tp = open_pipe(seed, &rng, &l, jitter);
  mlo_platform *plat = tp->plat;
  mlo_offload_settings s = MLO_OFFLOAD_SETTINGS_INIT;
  s.sync = sync;
  /* Drawn from a stream of its own, so the strict schedules of a seed stay
   * what they were before the budget policy existed. */
  uint64_t prng = seed ^ 0x6275646765740000ull;
  uint64_t largest = 0;
  for (size_t i = 0; i < mlo_pipeline_component_count(tp->pipe); i++) {
    uint64_t b = mlo_component_bytes(mlo_pipeline_component_at(tp->pipe, i));
    if (b > largest) largest = b;
  }
  mlo_platform_memory mem;
  assert_ok(mlo_platform_get_memory(plat, &mem));
  if (below(&prng, 3) == 0 && largest <= mem.total_bytes) { /* else no budget can hold it */
    s.policy = MLO_POLICY_BUDGET;
    s.prefetch = below(&prng, 4) != 0;
    s.budget_bytes = largest + splitmix(&prng) % (mem.total_bytes - largest + 1);
    if (!s.budget_bytes) s.budget_bytes = 1; /* only empty components: any budget holds them */
    if (below(&prng, 2)) { /* DiTs in blocks (one a tensor), the budget below the largest */
      uint64_t least = 0;
      for (size_t i = 0; i < mlo_pipeline_component_count(tp->pipe); i++) {
        mlo_component *c = mlo_pipeline_component_at(tp->pipe, i);
        if (mlo_component_role(c) == MLO_ROLE_DIT)
          for (size_t k = 0; k < mlo_component_tensor_count(c); k++) {
            mlo_tensor *x = mlo_component_tensor_at(c, k);
            if (mlo_tensor_owner(x) == c && strcmp(mlo_tensor_name(x), "tied")) /* not an alias */
              assert_ok(mlo_tensor_set_block(x, (int)k));
          }
        uint64_t cl = mlo_component_stream_least(c);
        if (cl > least) least = cl;
      }
      if (least < largest) {
        s.budget_bytes = least + splitmix(&prng) % (largest - least);
        t->streamed++;
      }
    }
    declare_schedule(tp, &prng);
    tp->exclusion_in_forward = false; /* the budget decides, not the roles */
    t->budget++;
  }
  int rc = mlo_offload_enable(tp->pipe, &s);
  if (rc && !(rc == MLO_ENOMEM_DEVICE && l.undersized))
    fail_msg("seed %llu: enable -> %s: %s", (unsigned long long)seed, mlo_err_name(rc),
             mlo_pipeline_errmsg(tp->pipe));
  if (rc)
    t->enable_refused++;
  else
    t->threads += run_workers(tp, &l, &rng, seed, t, &s);
  if (tp->first_failure[0])
    fail_msg("seed %llu: inside a forward: %s", (unsigned long long)seed, tp->first_failure);
  t->block_loads += tu_pstats(tp).total.block_loads;
  rc = mlo_pipeline_audit(tp->pipe);
  if (rc) fail_msg("seed %llu: audit: %s", (unsigned long long)seed, mlo_pipeline_errmsg(tp->pipe));
  if (tu_device_used(plat) != tu_pstats(tp).device_bytes)
    fail_msg("seed %llu: platform uses %llu device bytes, pipeline accounts %llu",
             (unsigned long long)seed, (unsigned long long)tu_device_used(plat),
             (unsigned long long)tu_pstats(tp).device_bytes);
  assert_ok(mlo_offload_disable(tp->pipe));
  tu_pipe_free(tp);
  if (tu_device_used(plat))
    fail_msg("seed %llu: %llu device bytes in use after free", (unsigned long long)seed,
             (unsigned long long)tu_device_used(plat));
  mlo_platform_close(plat);
  t->schedules++;
  t->undersized += l.undersized;
  t->jitter += jitter;
  t->device_sync += sync == MLO_SYNC_DEVICE;
}

static void test_race_sweep(void **state) {
  (void)state;
  totals t;
  memset(&t, 0, sizeof t);
  for (unsigned i = 0; i < n_schedules; i++) run_schedule(first_seed + i, &t);
  printf("schedules: %u (seeds %llu..%llu), %u threads in all, %u forwards checked; "
         "%u with jitter, %u sync=device, %u undersized (%u out-of-memory refusals, %u at enable), "
         "%u EBUSY (try_acquire, enable/disable), %u nested conflicts refused; %u schedules "
         "toggling offload (%u toggles); %u under the budget policy (%u streaming DiTs, %llu "
         "block copies)\n",
         t.schedules, (unsigned long long)first_seed,
         (unsigned long long)(first_seed + n_schedules - 1), t.threads, t.forwards, t.jitter,
         t.device_sync, t.undersized, t.oom, t.enable_refused, t.busy, t.deadlk, t.toggling,
         t.toggled, t.budget, t.streamed, (unsigned long long)t.block_loads);
  assert_true(t.budget > 0 || n_schedules < 10);
  assert_true((t.streamed > 0 && t.block_loads > 0) || n_schedules < 30);
  assert_true(t.toggled > 0 || n_schedules < 10);
  assert_int_equal(t.schedules, n_schedules);
}

int main(int argc, char **argv) {
  if (argc > 1) n_schedules = (unsigned)strtoul(argv[1], NULL, 10);
  if (argc > 2) first_seed = strtoull(argv[2], NULL, 10);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_race_sweep)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
