/*
 * plan_output.c — what `mlo plan` prints: the card's table (text), the
 * JSON object a script reads, the one-line summary per card, and the line
 * of advice with the `mlo run` flags that reproduce it.
 */
#include "plan_cmd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

double plan_overhead(const plan_result *pr, const pol_result *q) {
  return pr->compute_s > 0 ? q->wall_s / pr->compute_s - 1 : 0;
}

/* An overhead as "+1.32%": rounded first, so float noise never prints
 * as "-0.00%". */
const char *plan_pct(double x) {
  static char bufs[4][24];
  static unsigned next;
  char *b = bufs[next++ % 4];
  double v = round(x * 1e4) / 1e2;
  snprintf(b, 24, "%+.2f%%", v == 0 ? 0.0 : v);
  return b;
}

/* A size as a flag takes it: "20G", "512M", else bytes. */
static const char *size_arg(uint64_t b) {
  static char buf[32];
  static const char *const units[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (b && u < 4 && b % 1024 == 0) b /= 1024, u++;
  snprintf(buf, sizeof buf, "%llu%s", (unsigned long long)b, units[u]);
  return buf;
}

/* The reserve as a flag takes it: rounded up to a whole MiB, so the
 * flag leaves at least what the plan kept free. */
static uint64_t reserve_arg(uint64_t b) {
  const uint64_t mib = 1ull << 20;
  return (b + mib - 1) / mib * mib;
}

/* The advice with a host budget, for a diffusers user (issue 41): the
 * Python lines that run it through mlo.torch, never reading the weights
 * into torch (docs/python.md). */
static void print_python(const plan_args *pa, const plan_result *pr, const plan_job *job,
                         FILE *out) {
  char tail[128] = "";
  if (pr->advice >= POL_BUDGET && pa->have_budget)
    snprintf(tail, sizeof tail, ", policy=\"budget\", budget=%llu", (unsigned long long)pa->budget);
  else if (pr->advice >= POL_BUDGET && pr->reserve)
    snprintf(tail, sizeof tail, ", policy=\"budget\", reserve=%llu << 20",
             (unsigned long long)(reserve_arg(pr->reserve) >> 20));
  else if (pr->advice >= POL_BUDGET)
    snprintf(tail, sizeof tail, ", policy=\"budget\"");
  fprintf(out,
          "  in Python (diffusers), the weights never read into torch: import mlo.torch;\n"
          "  pipe = mlo.torch.from_pretrained(%s, \"%s\", device=\"cuda\", host_memory=\"%s\"%s)\n",
          job->pipeline_class[0] ? job->pipeline_class : "<its pipeline class>",
          pa->preset ? "<its diffusers directory>" : pa->src.label, size_arg(pa->host), tail);
}

static void print_advice(const plan_args *pa, const plan_result *pr, const plan_job *job,
                         FILE *out) {
  if (pr->advice < 0) {
    bool host = false; /* a row refused for the host budget alone */
    for (int p = POL_STRICT; p < POL_COUNT; p++)
      host = host || (pa->have_host && plan_wanted(pa, p) && strstr(pr->pol[p].why, "host budget"));
    char tiled[160] = ""; /* the VAE's decode sets the reserve: tiling it is the first step */
    if (pr->reserve_but_vae && !strcmp(pr->reserve_from, "model"))
      snprintf(tiled, sizeof tiled, "a tiled VAE decode (vae.enable_tiling(), then --reserve %s), ",
               size_arg(reserve_arg(pr->reserve_but_vae)));
    fprintf(out,
            "advice: nothing fits on %s%s; try %s%s--dtype fp8 (or a GGUF type) or a larger "
            "card\n",
            pr->dev.title, host ? " in this host memory" : "", tiled,
            host ? "a larger --host-memory (the rows say what must stay in it), " : "");
    return;
  }
  const pol_result *q = &pr->pol[pr->advice];
  char flags[256] = "";
  if (pr->advice == POL_RESIDENT)
    snprintf(flags, sizeof flags, " --offload none");
  else if (pr->advice >= POL_BUDGET)
    snprintf(flags, sizeof flags, " --policy budget%s",
             pr->advice == POL_BUDGET ? " --no-prefetch" : "");
  size_t fl = strlen(flags);
  if (pr->advice >= POL_BUDGET && pa->have_budget)
    snprintf(flags + fl, sizeof flags - fl, " --budget %s", size_arg(pa->budget));
  else if (pr->advice >= POL_BUDGET && pr->reserve)
    snprintf(flags + fl, sizeof flags - fl, " --reserve %s", size_arg(reserve_arg(pr->reserve)));
  fl = strlen(flags);
  if (pr->advice != POL_RESIDENT && pa->have_host)
    snprintf(flags + fl, sizeof flags - fl, " --host-memory %s", size_arg(pa->host));
  char launch[64] = "", node[96] = "";
  if (pr->node) { /* every rank of the node runs it, loading as the topology says */
    snprintf(launch, sizeof launch, "mpirun -np %u ", pr->gpus);
    snprintf(node, sizeof node, " --ranks auto --node %s", pr->node->name);
  }
  fprintf(out, "advice: %s, %s over all-resident: %smlo run %s --platform cuda%s --steps %d%s\n",
          pol_names[pr->advice], plan_pct(plan_overhead(pr, q)), launch,
          pa->preset ? "<its diffusers directory>" : pa->src.label, node, pr->steps, flags);
  if (pa->have_host && pr->advice != POL_RESIDENT && !pr->node) print_python(pa, pr, job, out);
}

/* On a unified-memory machine (GB10, GH200), why offload is the wrong tool
 * (docs/plan.md, "Unified memory"); NULL on a discrete card. */
static const char *unified_advice(const plan_result *pr) {
  static char buf[1024];
  if (pr->dev.unified == PLAN_MEM_SHARED)
    snprintf(buf, sizeof buf,
             "offload is the wrong tool on %s: its CPU and GPU share one pool of memory, so "
             "the host copy an offload policy keeps takes the very memory it was to free, and "
             "each load copies the pool into itself, reading and writing bytes the forward "
             "could read where they are (twice the traffic). Keep every component where it "
             "is (--offload none); if they do not fit, a smaller --dtype (fp8, a GGUF type) "
             "helps and offload does not. Offload on unified memory has been reported 2.4-3.4x "
             "slower (unslothai/unsloth#10380)",
             pr->dev.title);
  else if (pr->dev.unified == PLAN_MEM_COHERENT)
    snprintf(buf, sizeof buf,
             "offload is the wrong tool on %s: its GPU reads the Grace CPU's memory coherently "
             "over NVLink-C2C, so what does not fit the HBM can stay in CPU memory and be read "
             "there (or migrated by the driver as it is used) with no copy of mlo's; an offload "
             "policy keeps a second copy and, for each load, writes and reads again in HBM the "
             "bytes a direct read takes once. Keep what fits resident (--offload none) and "
             "leave the rest in CPU memory (CUDA managed or system-allocated memory). Offload "
             "on unified memory has been reported 2.4-3.4x slower "
             "(unslothai/unsloth#10380)",
             pr->dev.title);
  else
    return NULL;
  return buf;
}

static const char *secs(double s) {
  static char bufs[8][32];
  static unsigned next;
  char *b = bufs[next++ % 8];
  if (s >= 100)
    snprintf(b, 32, "%.0f s", s);
  else if (s >= 1)
    snprintf(b, 32, "%.2f s", s);
  else
    snprintf(b, 32, "%.1f ms", s * 1e3);
  return b;
}

/* What the activations take and the reserve every row keeps free. */
static void print_memory(const plan_args *pa, const plan_result *pr, FILE *out) {
  fprintf(out,
          "memory:   activations at their peak (%s kernels): ", pa->cpu_kernels ? "CPU" : "CUDA");
  int shown = 0;
  for (size_t i = 0; i < pr->ncomp; i++) {
    const struct comp_plan *c = &pr->comps[i];
    if (!(c->act.bytes > 0)) continue;
    fprintf(out, "%s%s %s", shown++ ? ", " : "", tool_esc(c->name),
            tool_size((uint64_t)c->act.bytes));
    bool peak = (int)i == pr->act_comp;
    if (c->act.tokens > 0 && c->role == MLO_ROLE_DIT)
      fprintf(out, " (%.0f tokens%s%s)", c->act.tokens, peak ? ", at the " : "",
              peak ? c->act.phase : "");
    else if (peak)
      fprintf(out, " (at the %s)", c->act.phase);
  }
  if (!shown) fprintf(out, "not known for these components' layouts");
  fprintf(out, "\n          reserve %s kept free in every row", tool_size(pr->reserve));
  if (!strcmp(pr->reserve_from, "model")) {
    fprintf(out, ": the largest activations + %.0f%% (allocator), a CUDA context %s, workspaces %s",
            PLAN_FRAGMENTATION * 100, tool_size(PLAN_CUDA_CONTEXT_BYTES),
            tool_size(PLAN_WORKSPACE_BYTES));
    fprintf(out,
            pa->have_budget ? " (the budget rows: --budget)\n" : " (--reserve SIZE overrides)\n");
    if (pr->reserve_but_vae)
      fprintf(out,
              "          (the %s's decode sets it; decoded in tiles, diffusers' "
              "vae.enable_tiling(), not modelled, the rest would need --reserve %s)\n",
              tool_esc(pr->comps[pr->act_comp].name), tool_size(pr->reserve_but_vae));
  } else {
    fprintf(out, " (--reserve; the model's would be %s)\n", tool_size(pr->model_reserve));
  }
}

void plan_print_text(const plan_args *pa, const plan_result *pr, const plan_job *job, FILE *out) {
  fprintf(out, "pipeline: %s%s, %zu components, %s\n", pa->src.label,
          pa->preset ? " (preset, full size, declared without files)" : "", pr->ncomp,
          tool_size(pr->all_bytes));
  fprintf(out, "device:   %s: %s%s, link %.1f GB/s", pr->dev.title, tool_size(pr->dev.memory),
          pr->dev.unified == PLAN_MEM_SHARED ? " unified (CPU and GPU)" : "", pr->dev.link / 1e9);
  if (pr->dev.unified != PLAN_MEM_DISCRETE) fprintf(out, " (%s)", pr->dev.bus);
  if (pr->dev.bf16_tflops > 0)
    fprintf(out, ", %.0f TFLOPS bf16%s (mfu %.2f)", pr->dev.bf16_tflops,
            pr->dev.fp8_tflops > 0 && pr->dev.fp8_tflops != pr->dev.bf16_tflops ? " / fp8 x2" : "",
            pa->mfu);
  if (pr->assumed)
    fprintf(out,
            "\n          (assumed: the compute of %s, the built-in card nearest %s%s: give "
            "--device for your card)",
            pr->assumed->name, tool_size(pr->dev.memory),
            pa->have_link ? "" : ", on a PCIe 4.0 x16 link");
  if (pr->node) {
    const mlo_load_plan *l = &pr->loads;
    double fast = l->sharded ? l->sharded_s : l->replicated_s;
    double slow = l->sharded ? l->replicated_s : l->sharded_s;
    fprintf(out,
            "\nnode:     %ux %s: %s\n"
            "          %s loads: a GiB reaches every GPU in %.1f ms (%s: %.1f ms); each GPU's "
            "link %.1f GB/s, %.1f GB/s effective",
            pr->gpus, pr->node->title, pr->node->paths, l->sharded ? "sharded" : "replicated",
            fast * 1e3, l->sharded ? "replicated" : "sharded", slow * 1e3, pr->gpu_link / 1e9,
            pr->dev.link / 1e9);
  }
  fprintf(out, "\njob:      %dx%d", job->width, job->height);
  if (job->frames > 1) fprintf(out, ", %d frames", job->frames);
  fprintf(out, ", %d steps", job->steps);
  if (pr->split.first_steps < job->steps)
    fprintf(out, " (%d on the first DiT, %d on the second: %s)", pr->split.first_steps,
            job->steps - pr->split.first_steps, pr->split.source);
  fprintf(out, ", %d pass%s per step, %d text tokens", job->passes, job->passes > 1 ? "es" : "",
          job->text_tokens);
  if (job->batch > 1) fprintf(out, ", batch %d", job->batch);
  fputc('\n', out);
  fprintf(out, "forward:  ");
  for (size_t i = 0; i < pr->ncomp; i++) {
    const struct comp_plan *c = &pr->comps[i];
    if (c->role == MLO_ROLE_OTHER) continue;
    fprintf(out, "%s%s %s (%s%s)", i ? ", " : "", tool_esc(c->name), secs(c->forward_s),
            strcmp(c->source, "model") ? c->source : "", strcmp(c->source, "model") ? "" : "model");
  }
  fprintf(out, "\n          one prompt computes for %s (a warm all-resident prompt)\n",
          secs(pr->compute_s));
  print_memory(pa, pr, out);
  fputc('\n', out);
  fprintf(out, "%-16s %-4s %11s %11s %11s %9s %11s %11s\n", "policy", "fits", "peak device",
          "pinned host", "per prompt", "overhead", "stall", "moved");
  for (int p = 0; p < POL_COUNT; p++) {
    const pol_result *q = &pr->pol[p];
    if (!plan_wanted(pa, p)) continue;
    if (!q->fits) {
      fprintf(out, "%-16s %-4s %s\n", pol_names[p], "no", q->why);
      continue;
    }
    fprintf(out, "%-16s %-4s %11s %11s %11s %9s %11s %11s\n", pol_names[p], "yes",
            tool_size(q->peak_device), tool_size(q->pinned_host), secs(q->wall_s),
            plan_pct(plan_overhead(pr, q)), secs(q->stall_s), tool_size(q->h2d_bytes));
  }
  fprintf(out, "(per prompt: the steady state of %ld prompts; the first, cold, ", pa->prompts);
  if (pr->advice >= 0)
    fprintf(out, "takes %s with %s)\n", secs(pr->pol[pr->advice].first_wall_s),
            pol_names[pr->advice]);
  else
    fprintf(out, "is not run)\n");
  if (pr->advice >= 0 && pr->reserve) {
    const pol_result *q = &pr->pol[pr->advice];
    fprintf(out, "(peak device: the weights'; with the reserve, %s needs %s of %s)\n",
            pol_names[pr->advice], tool_size(q->peak_device + pr->reserve),
            tool_size(pr->dev.memory));
  }
  fprintf(out, "(loads %s)\n",
          pa->whole_loads ? "whole: each forward waits for all of its component (--whole-loads)"
                          : "block by block: a forward waits for the prologue and each block's "
                            "own copy, not the whole component");
  if (pa->have_host) {
    fprintf(out, "host memory %s for %s of weights, disk %.2f GB/s (--disk-bw):\n",
            tool_size(pa->host), tool_size(pr->all_bytes),
            (pa->have_disk ? (double)pa->disk : 3e9) / 1e9);
    for (int p = POL_STRICT; p < POL_COUNT; p++) {
      const pol_result *q = &pr->pol[p];
      if (!plan_wanted(pa, p) || !q->fits) continue;
      fprintf(out,
              "  %-16s keeps %s of slabs, reads %s from disk per prompt: %s per prompt (%s) "
              "over the same with every slab in host memory\n",
              pol_names[p], tool_size(q->host_slab), tool_size(q->disk_bytes), secs(q->disk_cost_s),
              plan_pct(q->disk_cost_s / (q->wall_s - q->disk_cost_s)));
    }
  }
  print_advice(pa, pr, job, out);
  const char *unified = unified_advice(pr);
  if (unified) fprintf(out, "unified memory: %s.\n", unified);
}

cJSON *plan_result_json(const plan_args *pa, const plan_result *pr, const plan_job *job) {
  cJSON *o = cJSON_CreateObject();
  cJSON *d = cJSON_AddObjectToObject(o, "device");
  cJSON_AddStringToObject(d, "name", pr->dev.name);
  cJSON_AddStringToObject(d, "title", pr->dev.title);
  cJSON_AddNumberToObject(d, "memory_bytes", (double)pr->dev.memory);
  cJSON_AddNumberToObject(d, "link_bytes_per_s", pr->dev.link);
  cJSON_AddNumberToObject(d, "bf16_tflops", pr->dev.bf16_tflops);
  cJSON_AddNumberToObject(d, "fp8_tflops", pr->dev.fp8_tflops);
  cJSON_AddNumberToObject(d, "mfu", pa->mfu);
  cJSON_AddStringToObject(d, "bus", pr->dev.bus);
  cJSON_AddBoolToObject(d, "unified_memory", pr->dev.unified != PLAN_MEM_DISCRETE);
  if (pr->custom) cJSON_AddBoolToObject(d, "assumed", pr->assumed != NULL);
  if (pr->assumed) cJSON_AddStringToObject(d, "assumed_compute_of", pr->assumed->name);
  if (pr->node) {
    const mlo_node_topology t = pr->topo;
    cJSON *n = cJSON_AddObjectToObject(o, "node");
    cJSON_AddStringToObject(n, "name", pr->node->name);
    cJSON_AddStringToObject(n, "title", pr->node->title);
    cJSON_AddStringToObject(n, "paths", pr->node->paths);
    cJSON_AddNumberToObject(n, "gpus", pr->gpus);
    cJSON_AddNumberToObject(n, "gpu_link_bytes_per_s", t.link_bps);
    cJSON_AddNumberToObject(n, "group", t.group);
    cJSON_AddNumberToObject(n, "uplink_bytes_per_s", t.uplink_bps);
    cJSON_AddNumberToObject(n, "fabric_bytes_per_s", t.fabric_bps);
    cJSON_AddBoolToObject(n, "fabric_via_uplinks", t.fabric_via_uplinks);
    cJSON_AddStringToObject(n, "loads", pr->loads.sharded ? "sharded" : "replicated");
    cJSON_AddNumberToObject(n, "replicated_s_per_gib", pr->loads.replicated_s);
    cJSON_AddNumberToObject(n, "sharded_s_per_gib", pr->loads.sharded_s);
    cJSON_AddNumberToObject(n, "effective_link_bytes_per_s", pr->dev.link);
  }
  cJSON *j = cJSON_AddObjectToObject(o, "job");
  cJSON_AddStringToObject(j, "family", job->family);
  cJSON_AddNumberToObject(j, "width", job->width);
  cJSON_AddNumberToObject(j, "height", job->height);
  cJSON_AddNumberToObject(j, "frames", job->frames);
  cJSON_AddNumberToObject(j, "steps", job->steps);
  cJSON_AddNumberToObject(j, "first_dit_steps", pr->split.first_steps);
  cJSON_AddNumberToObject(j, "passes", job->passes);
  cJSON_AddNumberToObject(j, "text_tokens", job->text_tokens);
  cJSON_AddNumberToObject(j, "batch", job->batch);
  cJSON_AddNumberToObject(j, "prompts", (double)pa->prompts);
  cJSON *comps = cJSON_AddArrayToObject(o, "components");
  for (size_t i = 0; i < pr->ncomp; i++) {
    const struct comp_plan *c = &pr->comps[i];
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", c->name);
    cJSON_AddStringToObject(e, "role", mlo_role_name(c->role));
    cJSON_AddNumberToObject(e, "device_bytes", (double)c->bytes);
    cJSON_AddStringToObject(e, "compute_dtype", mlo_dtype_name(c->dtype));
    cJSON_AddNumberToObject(e, "flops", c->flops);
    cJSON_AddNumberToObject(e, "forward_s", c->forward_s);
    cJSON_AddStringToObject(e, "forward_source", c->source);
    cJSON_AddNumberToObject(e, "activation_bytes", c->act.bytes);
    cJSON_AddNumberToObject(e, "activation_tokens", c->act.tokens);
    cJSON_AddStringToObject(e, "activation_phase", c->act.phase);
    cJSON_AddItemToArray(comps, e);
  }
  cJSON *m = cJSON_AddObjectToObject(o, "memory");
  cJSON_AddNumberToObject(m, "activation_peak_bytes", pr->act_peak);
  if (pr->act_comp >= 0)
    cJSON_AddStringToObject(m, "activation_peak_component", pr->comps[pr->act_comp].name);
  else
    cJSON_AddNullToObject(m, "activation_peak_component");
  cJSON_AddStringToObject(m, "kernels", pa->cpu_kernels ? "cpu" : "cuda");
  cJSON_AddNumberToObject(m, "cuda_context_bytes", (double)PLAN_CUDA_CONTEXT_BYTES);
  cJSON_AddNumberToObject(m, "workspace_bytes", (double)PLAN_WORKSPACE_BYTES);
  cJSON_AddNumberToObject(m, "fragmentation", PLAN_FRAGMENTATION);
  cJSON_AddNumberToObject(m, "model_reserve_bytes", (double)pr->model_reserve);
  cJSON_AddNumberToObject(m, "reserve_bytes", (double)pr->reserve);
  if (pr->reserve_but_vae) /* the VAE's decode is the largest: the reserve without it */
    cJSON_AddNumberToObject(m, "model_reserve_without_vae_bytes", (double)pr->reserve_but_vae);
  cJSON_AddStringToObject(m, "reserve_from", pr->reserve_from);
  cJSON_AddNumberToObject(o, "all_resident_bytes", (double)pr->all_bytes);
  cJSON_AddNumberToObject(o, "compute_s", pr->compute_s);
  cJSON *pols = cJSON_AddArrayToObject(o, "policies");
  for (int p = 0; p < POL_COUNT; p++) {
    const pol_result *q = &pr->pol[p];
    if (!plan_wanted(pa, p)) continue;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "policy", pol_names[p]);
    cJSON_AddBoolToObject(e, "fits", q->fits);
    if (!q->fits) {
      cJSON_AddStringToObject(e, "why", q->why);
    } else {
      cJSON_AddNumberToObject(e, "wall_s", q->wall_s);
      cJSON_AddNumberToObject(e, "stall_s", q->stall_s);
      cJSON_AddNumberToObject(e, "overhead", plan_overhead(pr, q));
      cJSON_AddNumberToObject(e, "first_wall_s", q->first_wall_s);
      cJSON_AddNumberToObject(e, "total_wall_s", q->total_wall_s);
      cJSON_AddNumberToObject(e, "total_stall_s", q->total_stall_s);
      cJSON_AddNumberToObject(e, "total_h2d_bytes", (double)q->total_h2d);
      cJSON_AddNumberToObject(e, "peak_device_bytes", (double)q->peak_device);
      cJSON_AddNumberToObject(e, "device_need_bytes", (double)(q->peak_device + pr->reserve));
      cJSON_AddNumberToObject(e, "pinned_host_bytes", (double)q->pinned_host);
      cJSON_AddNumberToObject(e, "h2d_bytes", (double)q->h2d_bytes);
      cJSON_AddNumberToObject(e, "loads", (double)q->loads);
      if (p >= POL_BUDGET) cJSON_AddNumberToObject(e, "budget_bytes", (double)q->budget);
      if (pa->have_host && p != POL_RESIDENT) {
        cJSON_AddNumberToObject(e, "host_slab_bytes", (double)q->host_slab);
        cJSON_AddNumberToObject(e, "disk_read_bytes", (double)q->disk_bytes);
        cJSON_AddNumberToObject(e, "total_disk_read_bytes", (double)q->total_disk);
        cJSON_AddNumberToObject(e, "disk_cost_s", q->disk_cost_s);
      }
    }
    cJSON_AddItemToArray(pols, e);
  }
  if (pr->advice >= 0)
    cJSON_AddStringToObject(o, "advice", pol_names[pr->advice]);
  else
    cJSON_AddNullToObject(o, "advice");
  const char *unified = unified_advice(pr);
  if (unified) cJSON_AddStringToObject(o, "unified_memory_advice", unified);
  return o;
}

void plan_print_summary_line(const plan_result *pr, FILE *out) {
  const pol_result *q = pr->advice >= 0 ? &pr->pol[pr->advice] : NULL;
  fprintf(out, "%-13s %10s %7.0f GB/s  %-4s  %-16s", pr->dev.name, tool_size(pr->dev.memory),
          pr->dev.link / 1e9, pr->pol[POL_RESIDENT].fits ? "yes" : "no",
          q ? pol_names[pr->advice] : "nothing fits");
  if (q)
    fprintf(out, " %10s  %9s\n", secs(q->wall_s), plan_pct(plan_overhead(pr, q)));
  else
    fprintf(out, " %s\n", pr->pol[POL_BUDGET].why);
}

/* "device 0: transformer transformer_2 (peak 13.2 GiB); device 1: ..." */
static void print_where(const plan_result *m, int p, FILE *out) {
  const pol_result *q = &m->pol[p];
  fprintf(out, "  %-16s", "");
  for (size_t d = 0; d < m->ndevices; d++) {
    fprintf(out, "%sdevice %zu:", d ? "; " : "", d);
    size_t n = 0;
    for (size_t i = 0; i < m->ncomp; i++)
      if (m->comps[i].device[p] == d) fprintf(out, " %s", tool_esc(m->comps[i].name)), n++;
    fprintf(out, "%s (peak %s)", n ? "" : " nothing", tool_size(q->dev_peak[d]));
  }
  fputc('\n', out);
}

void plan_print_devices(const plan_args *pa, const plan_result *one, const plan_result *m,
                        FILE *out) {
  fprintf(out,
          "\non %zu devices: %zu x %s, one pipeline, each component placed on one device at "
          "enable\n(each device keeps the reserve, %s, free; one clock, the calling thread's; "
          "each its own %.1f GB/s link)\n",
          m->ndevices, m->ndevices, one->dev.title, tool_size(m->held), m->dev.link / 1e9);
  fprintf(out, "%-16s %-4s %11s %11s %11s %11s %11s\n", "policy", "fits", "1 device", "per prompt",
          "moved 1", "moved", "modelled");
  for (int p = 0; p < POL_COUNT; p++) {
    const pol_result *q = &m->pol[p], *q1 = &one->pol[p];
    if (!plan_wanted(pa, p)) continue;
    if (!q->fits) {
      fprintf(out, "%-16s %-4s %s\n", pol_names[p], "no", q->why);
      continue;
    }
    fprintf(out, "%-16s %-4s %11s %11s %11s %11s %11s\n", pol_names[p], "yes",
            q1->fits ? secs(q1->wall_s) : "-", secs(q->wall_s),
            q1->fits ? tool_size(q1->h2d_bytes) : "-", tool_size(q->h2d_bytes),
            p == POL_RESIDENT ? "-" : tool_size(q->placement.moved_bytes));
    print_where(m, p, out);
    if (p == POL_RESIDENT)
      fprintf(out,
              "  %-16swhy: every component resident: on device 0 where all fit there, else "
              "spread so that they do\n",
              "");
    else
      fprintf(out,
              "  %-16swhy: placed to move the fewest bytes per prompt as the policy's rule "
              "counts them: %s over %zu devices, %s with every component on device 0\n",
              "", tool_size(q->placement.moved_bytes), m->ndevices,
              tool_size(q->placement.one_device_bytes));
  }
  fprintf(out,
          "(1 device, moved 1: the card's table above; per prompt, moved: measured on the %zu "
          "simulated devices, the steady state; modelled: placement's own count at enable;\n"
          " all-resident: on device 0 where it fits there, else spread so that every component "
          "fits)\n",
          m->ndevices);
}

cJSON *plan_devices_json(const plan_args *pa, const plan_result *one, const plan_result *m) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "count", (double)m->ndevices);
  cJSON_AddNumberToObject(o, "memory_bytes_each", (double)m->dev.memory);
  cJSON_AddNumberToObject(o, "held_bytes_each", (double)m->held);
  cJSON_AddNumberToObject(o, "link_bytes_per_s_each", m->dev.link);
  cJSON *pols = cJSON_AddArrayToObject(o, "policies");
  for (int p = 0; p < POL_COUNT; p++) {
    const pol_result *q = &m->pol[p], *q1 = &one->pol[p];
    if (!plan_wanted(pa, p)) continue;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddItemToArray(pols, e);
    cJSON_AddStringToObject(e, "policy", pol_names[p]);
    cJSON_AddBoolToObject(e, "fits", q->fits);
    if (!q->fits) {
      cJSON_AddStringToObject(e, "why", q->why);
      continue;
    }
    cJSON_AddNumberToObject(e, "wall_s", q->wall_s);
    cJSON_AddNumberToObject(e, "stall_s", q->stall_s);
    cJSON_AddNumberToObject(e, "h2d_bytes", (double)q->h2d_bytes);
    cJSON_AddNumberToObject(e, "total_wall_s", q->total_wall_s);
    cJSON_AddNumberToObject(e, "total_stall_s", q->total_stall_s);
    cJSON_AddNumberToObject(e, "total_h2d_bytes", (double)q->total_h2d);
    cJSON_AddNumberToObject(e, "peak_device_bytes", (double)q->peak_device);
    if (q1->fits) {
      cJSON_AddNumberToObject(e, "one_device_wall_s", q1->wall_s);
      cJSON_AddNumberToObject(e, "one_device_h2d_bytes", (double)q1->h2d_bytes);
    } else {
      cJSON_AddNullToObject(e, "one_device_wall_s");
      cJSON_AddNullToObject(e, "one_device_h2d_bytes");
    }
    cJSON *pl = cJSON_AddObjectToObject(e, "placement");
    cJSON_AddBoolToObject(pl, "placed", true); /* all-resident too: spread where it must */
    cJSON_AddNumberToObject(pl, "moved_bytes", (double)q->placement.moved_bytes);
    cJSON_AddNumberToObject(pl, "one_device_bytes", (double)q->placement.one_device_bytes);
    cJSON *devs = cJSON_AddArrayToObject(e, "devices");
    for (size_t d = 0; d < m->ndevices; d++) {
      cJSON *dv = cJSON_CreateObject();
      cJSON_AddItemToArray(devs, dv);
      cJSON_AddNumberToObject(dv, "index", (double)d);
      cJSON_AddNumberToObject(dv, "room_bytes", (double)q->placement.room_bytes[d]);
      cJSON_AddNumberToObject(dv, "peak_device_bytes", (double)q->dev_peak[d]);
      cJSON *names = cJSON_AddArrayToObject(dv, "components");
      for (size_t i = 0; i < m->ncomp; i++)
        if (m->comps[i].device[p] == d)
          cJSON_AddItemToArray(names, cJSON_CreateString(m->comps[i].name));
    }
  }
  return o;
}
