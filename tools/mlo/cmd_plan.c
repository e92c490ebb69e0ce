/*
 * cmd_plan.c — `mlo plan PIPELINE --device CARD`: what model-level offload
 * will cost on a card before anything is downloaded or run.  The pipeline
 * (a directory or files, headers only, or a preset at full size declared
 * without files) is opened on the simulated platform, each forward is given
 * the time the compute model (plan_model.c) or --step-time says, and the
 * same session code as `mlo run` runs every policy on the virtual clock:
 * the projection is the library's real decisions, not a formula beside
 * them (docs/plan.md).
 */
#include "plan_cmd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const char *const pol_names[POL_COUNT] = {"all-resident", "strict", "budget", "budget+prefetch"};

static void help(void) {
  printf("usage: mlo plan PIPELINE [--device CARD] [flags]\n\n"
         "Projects what model-level offload costs on a card, without a GPU and without\n"
         "the weights: PIPELINE is a diffusers directory, a component folder, a\n"
         ".safetensors or .gguf file (only headers are read), or a preset at its real\n"
         "size, declared without writing files (wan2.2-t2v, flux, qwen-image, sd3; with\n"
         "mlo synth's :full-depth suffix it is the same model).  Each\n"
         "policy runs mlo's own residency code on a simulated device whose copies take\n"
         "bytes / link and whose forwards take the compute model's time, for --prompts\n"
         "generations; per-prompt figures are the steady state (prompts 2..N).\n\n"
         "flags (the same meaning as in mlo run):\n"
         "  --device CARD         a built-in profile (list below); without it and\n"
         "                        without --device-memory: one line per built-in card\n"
         "  --device-memory SIZE  device memory (overrides the card's); without --device\n"
         "                        or --tflops, the compute of the built-in card nearest\n"
         "                        SIZE and a PCIe 4.0 x16 link are assumed (said so)\n"
         "  --node NODE           a node of several cards (list below): its ranks load\n"
         "                        each switch replicated or sharded, whichever its copy\n"
         "                        paths make faster, and the table's link is that\n"
         "                        load's rate per GPU (--link sets each GPU's own; the\n"
         "                        node's uplinks and fabric keep their ratios to it)\n"
         "  --gpus N              the node's GPUs (default: the profile's)\n"
         "  --devices N           one pipeline over N of the card (1..16, default 1):\n"
         "                        each component placed on one device at enable to move\n"
         "                        the fewest bytes per prompt (docs/placement.md), as\n"
         "                        mlo run --platform X --platform Y does; projected\n"
         "                        beside one card, with where each component went and\n"
         "                        why.  Each device keeps the reserve free; the devices\n"
         "                        share the calling thread's clock, each its own link.\n"
         "                        Not with --node or --gpus: placement and ranks do not\n"
         "                        combine yet\n"
         "  --link BYTES_PER_S    pinned host-to-device bandwidth, e.g. 25e9 (overrides)\n"
         "  --steps N             denoising steps (default: the pipeline's diffusers default)\n"
         "  --prompts N           generations per projected run (default 3, at least 2:\n"
         "                        the first is the cold one); a run that could last\n"
         "                        over 1e9 s on the simulated clock is refused\n"
         "  --policy P            only strict, or only budget (default: every policy)\n"
         "  --no-prefetch         with --policy budget: on-demand loads only\n"
         "  --whole-loads         each component loads in one piece, its forward waiting\n"
         "                        for all of it (default: block by block, as mlo run)\n"
         "  --offload none        only the all-resident row\n"
         "  --reserve SIZE        device memory every row leaves free (default: the\n"
         "                        activation model's: the largest forward's activations\n"
         "                        at the job, +10%%, a CUDA context and workspaces)\n"
         "  --budget SIZE         the budget policy's budget (the other rows keep the\n"
         "                        model's reserve)\n"
         "  --host-memory SIZE    host memory the weights' slabs may keep: the rest is\n"
         "                        read from disk at each load (docs/disk.md); the rows\n"
         "                        then say what the disk costs\n"
         "  --disk-bw BYTES_PER_S the disk's read rate (default 3e9, a PCIe 4.0 NVMe "
         "SSD)\n" TOOL_SPLIT_HELP "what to assume:\n"
         "  --dtype D             DiT and encoder weights in D: fp8, bf16, fp16, fp32, or a\n"
         "                        GGUF type (Q8_0, Q4_K, ...); norms and the VAE keep theirs\n"
         "  --step-time K=S,...   seconds per forward for a role (dit, encoder, vae) or a\n"
         "                        component name, e.g. dit=3.5,encoder=0.2,vae=4 (a\n"
         "                        measured mlo run's forward times make a validation)\n"
         "  --tflops T            dense TFLOPS instead of the card's\n"
         "  --mfu F               the fraction of it a forward achieves (default 0.4)\n"
         "  --width W --height H --frames F   the generation (default: diffusers': Wan2.2\n"
         "                        832x480 x 81 frames, 720p is --height 720 --width 1280;\n"
         "                        Flux, Qwen-Image, SD3 1024x1024)\n"
         "  --batch N             videos or images per call (default 1)\n"
         "  --kernels K           cuda (default) or cpu: whose kernels' temporaries the\n"
         "                        activation model counts (cpu: as torch on a CPU, to\n"
         "                        check it against a measured run there)\n"
         "  --cfg N               forwards per step: 2 with classifier-free guidance\n"
         "  --text-tokens N       prompt tokens\n"
         "  --job FAMILY          the default job of wan2.2-t2v, flux, qwen-image or sd3\n"
         "output:\n"
         "  --json                one JSON object: {\"policies\": [...], ...}\n"
         "  --timeline FILE.svg   the projected run of the advised policy, drawn as\n"
         "                        mlo run --timeline draws a real one\n" TOOL_SOURCE_HELP "\n"
         "cards:");
  for (size_t i = 0; i < plan_ndevices; i++) printf("%s %s", i ? "," : "", plan_devices[i].name);
  printf("\nnodes:\n");
  for (size_t i = 0; i < plan_nnodes; i++)
    printf("  %-11s %ux %s: %s\n", plan_nodes[i].name, plan_nodes[i].gpus, plan_nodes[i].title,
           plan_nodes[i].paths);
  printf("\nexamples:\n"
         "  mlo plan wan2.2-t2v --device rtx4090 --dtype fp8\n"
         "  mlo plan wan2.2-t2v --device h100-sxm --steps 40 --frames 33\n"
         "  mlo plan wan2.2-t2v --device rtx4090 --dtype bf16 --height 720 --width 1280\n"
         "  mlo plan wan2.2-t2v --device l40s --host-memory 32G --disk-bw 2e9\n"
         "  mlo plan /models/FLUX.1-dev --device l40s --json\n"
         "  mlo plan wan2.2-t2v --node l40s-4\n"
         "  mlo plan wan2.2-t2v --device rtx4090 --devices 2 --dtype fp8\n"
         "  mlo plan ckpt --device-memory 1G --link 2e8 --step-time dit=0.5,encoder=0.1,vae=0.2\n\n"
         "exit codes: 0 ok (also when nothing fits: the table says why), 2 bad usage or\n"
         "input, 4 other failure.\n");
}

/* --step-time K=S[,K=S...] ("s" or "ms" after the number): parsed here,
 * matched to components once the pipeline is open. */
static void parse_step_times(targs *a, const char *text, plan_args *pa) {
  for (const char *p = text; p && *p;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    const char *eq = memchr(p, '=', len);
    char *end = NULL;
    double s = eq ? strtod(eq + 1, &end) : -1;
    bool ms = end && end + 2 == p + len && !strncmp(end, "ms", 2);
    bool unit_ok = end && end > eq + 1 && /* a number, not "dit=" */
                   (end == p + len || (end + 1 == p + len && *end == 's') || ms);
    size_t klen = eq ? (size_t)(eq - p) : 0;
    if (!eq || !klen || klen >= sizeof pa->times[0].key || !unit_ok || !(s >= 0) || !isfinite(s) ||
        s > 1e6) {
      targs_error(a, "--step-time: expected NAME=SECONDS[,NAME=SECONDS...], got '%.*s'", (int)len,
                  p);
      return;
    }
    if (pa->ntimes == sizeof pa->times / sizeof pa->times[0]) {
      targs_error(a, "--step-time: more than %zu entries", pa->ntimes);
      return;
    }
    struct step_time *t = &pa->times[pa->ntimes++];
    snprintf(t->key, sizeof t->key, "%.*s", (int)klen, p);
    t->s = ms ? s / 1000 : s;
    p += len + (comma ? 1 : 0);
  }
}

static bool parse_flag(targs *a, plan_args *pa) {
  const char *v;
  static const char *const offload_words[] = {"none", "model", NULL};
  if (targs_value(a, "--device", &v)) {
    if (v && !plan_device_find(v))
      targs_error(a, "--device: unknown card '%s' (mlo plan --help lists them)", v);
    pa->device = v;
  } else if (targs_value(a, "--node", &v)) {
    if (v && !plan_node_find(v))
      targs_error(a, "--node: unknown node '%s' (mlo plan --help lists them)", v);
    pa->node = v;
  } else if (targs_value(a, "--gpus", &v)) {
    targs_int(a, "--gpus", v, 1, 4096, &pa->gpus);
  } else if (targs_value(a, "--devices", &v)) {
    targs_int(a, "--devices", v, 1, TOOL_MAX_DEVICES, &pa->devices);
  } else if (targs_value(a, "--device-memory", &v)) {
    pa->have_capacity = targs_size(a, "--device-memory", v, &pa->capacity);
  } else if (targs_value(a, "--link", &v)) {
    pa->have_link = targs_size(a, "--link", v, &pa->link);
    if (pa->have_link && pa->link < 1000000)
      targs_error(a, "--link: %s bytes per second is below 1e6", v);
  } else if (targs_value(a, "--tflops", &v)) {
    pa->have_tflops = targs_double(a, "--tflops", v, 0.001, 1e6, &pa->tflops);
  } else if (targs_value(a, "--mfu", &v)) {
    targs_double(a, "--mfu", v, 0.01, 1.0, &pa->mfu);
  } else if (targs_value(a, "--steps", &v)) {
    targs_int(a, "--steps", v, 1, 100000, &pa->steps);
  } else if (targs_value(a, "--prompts", &v)) {
    /* the first prompt is the cold one: the steady state needs a second */
    targs_int(a, "--prompts", v, 2, 1000, &pa->prompts);
  } else if (targs_value(a, "--policy", &v)) {
    targs_policy(a, "--policy", v, &pa->policy);
  } else if (targs_value(a, "--offload", &v)) {
    targs_choice(a, "--offload", v, offload_words, &pa->offload);
  } else if (targs_flag(a, "--no-prefetch")) {
    pa->no_prefetch = true;
  } else if (targs_flag(a, "--whole-loads")) {
    pa->whole_loads = true;
  } else if (targs_value(a, "--budget", &v)) {
    pa->have_budget = targs_size(a, "--budget", v, &pa->budget);
  } else if (targs_value(a, "--reserve", &v)) {
    /* 0 is a reserve too: nothing kept free (a host-platform run to compare with) */
    pa->have_reserve = v && mlo_parse_size(v, true, &pa->reserve) == MLO_OK;
    if (v && !pa->have_reserve)
      targs_error(a, "--reserve: expected a size such as 512M, 6G or 0, got '%s'", v);
  } else if (targs_value(a, "--host-memory", &v)) {
    pa->have_host = targs_size(a, "--host-memory", v, &pa->host);
  } else if (targs_value(a, "--disk-bw", &v)) {
    pa->have_disk = targs_size(a, "--disk-bw", v, &pa->disk);
    if (pa->have_disk && pa->disk < 1000000)
      targs_error(a, "--disk-bw: %s bytes per second is below 1e6", v);
  } else if (targs_value(a, "--dtype", &v)) {
    pa->have_dtype = v && plan_parse_dtype(v, &pa->dtype) == MLO_OK;
    if (v && !pa->have_dtype)
      targs_error(a, "--dtype: expected fp8, bf16, fp16, fp32 or a dtype name, got '%s'", v);
  } else if (targs_value(a, "--step-time", &v)) {
    if (v) parse_step_times(a, v, pa);
  } else if (targs_value(a, "--job", &v)) {
    plan_job j;
    if (v && !plan_job_for(v, &j))
      targs_error(a, "--job: expected wan2.2-t2v, flux, qwen-image or sd3, got '%s'", v);
    pa->job = v;
  } else if (targs_value(a, "--width", &v)) {
    targs_int(a, "--width", v, 16, 16384, &pa->width);
  } else if (targs_value(a, "--height", &v)) {
    targs_int(a, "--height", v, 16, 16384, &pa->height);
  } else if (targs_value(a, "--frames", &v)) {
    targs_int(a, "--frames", v, 1, 10000, &pa->frames);
  } else if (targs_value(a, "--cfg", &v)) {
    targs_int(a, "--cfg", v, 1, 8, &pa->cfg);
  } else if (targs_value(a, "--batch", &v)) {
    targs_int(a, "--batch", v, 1, 1024, &pa->batch);
  } else if (targs_value(a, "--kernels", &v)) {
    static const char *const kernel_words[] = {"cuda", "cpu", NULL};
    int k = 0;
    if (targs_choice(a, "--kernels", v, kernel_words, &k)) pa->cpu_kernels = k == 1;
  } else if (targs_value(a, "--text-tokens", &v)) {
    targs_int(a, "--text-tokens", v, 1, 65536, &pa->text_tokens);
  } else if (targs_value(a, "--timeline", &v)) {
    pa->timeline = v;
  } else if (targs_flag(a, "--json")) {
    pa->json = true;
  } else if (split_flag(a, &pa->split) || source_flag(a, &pa->src)) {
  } else {
    return false;
  }
  return true;
}

static int parse(int argc, char **argv, plan_args *pa) {
  targs a;
  targs_init(&a, "plan", argc, argv);
  while (targs_next(&a)) {
    if (targs_is_help(&a)) return -1;
    if (parse_flag(&a, pa)) continue;
    if (targs_cur(&a)[0] == '-' && targs_cur(&a)[1])
      targs_unknown(&a);
    else if (!pa->src.path && !pa->preset)
      pa->src.path = targs_cur(&a);
    else
      targs_error(&a, "unexpected argument '%s'", targs_cur(&a));
  }
  /* A preset's name that is not also a path here is the preset. */
  struct stat st;
  const char *preset = pa->src.path ? mlo_synth_preset_of(pa->src.path) : NULL;
  if (preset && stat(pa->src.path, &st) != 0) {
    pa->preset = preset;          /* NAME:full-depth is NAME at its real size */
    pa->src.label = pa->src.path; /* as given */
    pa->src.path = NULL;
  }
  if (!a.failed && !pa->src.path && !pa->preset && !pa->src.nfiles)
    targs_error(&a, "no pipeline: give a directory, a file, component files or a preset "
                    "(wan2.2-t2v, flux, qwen-image, sd3)");
  /* a bare word that is neither a path here nor a preset: most often a
   * preset's name mistyped, so the presets are named (issue 43) */
  if (!a.failed && pa->src.path && !pa->preset && !strchr(pa->src.path, '/') &&
      stat(pa->src.path, &st) != 0) {
    char names[256] = "";
    size_t used = 0;
    for (const mlo_synth_preset_info *p = mlo_synth_presets(); p && p->name; p++)
      used += (size_t)snprintf(names + used, used < sizeof names ? sizeof names - used : 0, "%s%s",
                               used ? ", " : "", p->name);
    targs_error(&a, "%s: neither a path here nor a preset (presets: %s)", pa->src.path, names);
  }
  if (!a.failed && !pa->preset) source_finish(&a, &pa->src);
  if (!a.failed && pa->preset && pa->src.nfiles)
    targs_error(&a, "give a preset or component files, not both");
  if (!a.failed && pa->split.have_steps && (pa->split.have_ratio || pa->split.have_shift))
    targs_error(&a, "--boundary-steps sets the split itself; drop --boundary and --flow-shift");
  if (!a.failed && pa->no_prefetch && pa->policy != MLO_POLICY_BUDGET)
    targs_error(&a, "--no-prefetch needs --policy budget");
  if (!a.failed && pa->offload == 0 && pa->policy >= 0)
    targs_error(&a, "--offload none runs no policy; drop --policy");
  const plan_node *node = plan_node_find(pa->node);
  if (!a.failed && node && pa->device &&
      plan_device_find(pa->device) != plan_device_find(node->card))
    targs_error(&a, "--node %s has %s cards: drop --device %s", node->name, node->card, pa->device);
  if (!a.failed && pa->devices > 1 && (node || pa->gpus))
    targs_error(&a,
                "--devices with %s: placement and ranks do not combine yet; plan the node's "
                "ranks (--node) or one pipeline over several devices (--devices), not both "
                "(docs/placement.md)",
                node ? "--node" : "--gpus");
  if (!a.failed && pa->gpus && !node) targs_error(&a, "--gpus is a node's: give --node");
  if (!a.failed && pa->devices > 1 && !pa->device && !pa->have_capacity && !pa->have_link &&
      !pa->have_tflops)
    targs_error(&a,
                "--devices %ld projects one card's devices: give --device (or "
                "--device-memory)",
                pa->devices);
  if (!a.failed && pa->devices > 1 && pa->timeline)
    targs_error(&a, "--timeline draws one card's projection; drop --devices");
  if (!a.failed && node) pa->device = node->card;
  if (!a.failed && pa->have_budget && pa->have_reserve)
    targs_error(&a, "give --budget or --reserve, not both");
  if (!a.failed && pa->have_disk && !pa->have_host)
    targs_error(&a, "--disk-bw is the disk tier's: give --host-memory");
  if (!a.failed && pa->have_host && pa->offload == 0)
    targs_error(&a, "--host-memory is for offload policies; --offload none keeps every slab");
  if (!a.failed && pa->policy == MLO_POLICY_STRICT && pa->have_budget)
    targs_error(&a, "--budget is the budget policy's; --policy strict has none");
  return a.failed ? TOOL_EXIT_USAGE : 0;
}

int cmd_plan(int argc, char **argv) {
  plan_args pa = {
      .scale = 1.0, .mfu = 0.4, .prompts = 3, .policy = -1, .offload = -1, .devices = 1};
  int code = parse(argc, argv, &pa);
  if (code == -1) {
    help();
    code = TOOL_EXIT_OK;
    goto out_free;
  }
  if (code) goto out_free;
  if ((code = tool_check_output("plan", "--timeline", pa.timeline))) goto out_free;
  bool one = pa.device || pa.have_capacity || pa.have_link || pa.have_tflops;
  plan_job job;
  plan_result pr;
  if (one) {
    code = plan_device_run(&pa, plan_device_find(pa.device), &pr, &job, pa.timeline != NULL);
    plan_result many = {0};
    plan_job many_job;
    if (!code && pa.devices > 1) /* the same card, N of them, each keeping one card's reserve */
      code = plan_devices_run(&pa, plan_device_find(pa.device), (size_t)pa.devices, pr.reserve,
                              &many, &many_job);
    if (!code) {
      if (pa.json) {
        cJSON *o = plan_result_json(&pa, &pr, &job);
        cJSON_AddStringToObject(o, "pipeline", pa.src.label);
        if (pa.devices > 1) cJSON_AddItemToObject(o, "devices", plan_devices_json(&pa, &pr, &many));
        code = tool_print_json_text(cJSON_Print(o));
        cJSON_Delete(o);
      } else {
        plan_print_text(&pa, &pr, &job, stdout);
        if (pa.devices > 1) plan_print_devices(&pa, &pr, &many, stdout);
      }
    }
    plan_free_result(&many);
    plan_free_result(&pr);
    goto out_free;
  }
  if (pa.timeline) {
    tool_failf("plan", "--timeline draws one card's projection: give --device");
    code = TOOL_EXIT_USAGE;
    goto out_free;
  }
  cJSON *all = pa.json ? cJSON_CreateObject() : NULL;
  cJSON *devs = all ? cJSON_AddArrayToObject(all, "devices") : NULL;
  for (size_t i = 0; i < plan_ndevices && !code; i++) {
    code = plan_device_run(&pa, &plan_devices[i], &pr, &job, false);
    if (code) break;
    if (!pa.json && i == 0) {
      printf("pipeline: %s, %zu components, %s; %dx%d", pa.src.label, pr.ncomp,
             tool_size(pr.all_bytes), job.width, job.height);
      if (job.frames > 1) printf(", %d frames", job.frames);
      printf(", %d steps\n\n%-13s %10s %12s  %-4s  %-16s %10s  %9s\n", job.steps, "card", "memory",
             "link", "all?", "best policy", "per prompt", "overhead");
    }
    if (pa.json)
      cJSON_AddItemToArray(devs, plan_result_json(&pa, &pr, &job));
    else
      plan_print_summary_line(&pr, stdout);
    plan_free_result(&pr);
  }
  if (!code && pa.json) {
    cJSON_AddStringToObject(all, "pipeline", pa.src.label);
    code = tool_print_json_text(cJSON_Print(all));
  } else if (!code) {
    printf("\n(all?: every component fits at once, leaving the reserve for the job's "
           "activations free.\n mlo plan %s --device CARD for a card's full table, the "
           "reserve's parts included)\n(",
           pa.src.label);
    for (size_t i = 0, n = 0; i < plan_ndevices; i++)
      if (plan_devices[i].unified != PLAN_MEM_DISCRETE)
        printf("%s%s", n++ ? ", " : "", plan_devices[i].name);
    printf(": unified memory, where offload is the wrong tool; --device says why)\n");
  }
  cJSON_Delete(all);
out_free:
  source_free(&pa.src);
  return code;
}

int plan_brief(const char *preset, const char *device, const char *dtype, uint64_t host,
               FILE *out) {
  plan_args pa = {
      .scale = 1.0, .mfu = 0.4, .prompts = 3, .policy = -1, .offload = -1, .devices = 1};
  pa.have_host = host != 0;
  pa.host = host;
  pa.preset = preset;
  pa.src.label = preset;
  pa.device = device;
  pa.have_dtype = dtype && plan_parse_dtype(dtype, &pa.dtype) == MLO_OK;
  const plan_device *dev = plan_device_find(device);
  if (!dev) return TOOL_EXIT_USAGE;
  plan_result pr;
  plan_job job;
  int code = plan_device_run(&pa, dev, &pr, &job, false);
  if (code) return code;
  char what[96];
  snprintf(what, sizeof what, "%s, %s%s%s", dev->name, dtype ? dtype : "bf16", host ? ", RAM " : "",
           host ? tool_size(host) : "");
  fprintf(out, "  %-28s", what);
  if (pr.advice < 0) {
    fprintf(out, " nothing fits (%s)\n", pr.pol[POL_STRICT].why);
  } else {
    for (int p = POL_RESIDENT; p < POL_COUNT; p++) {
      if (p == POL_BUDGET) continue; /* the demo's table has strict and budget+prefetch */
      const pol_result *q = &pr.pol[p];
      if (q->fits)
        fprintf(out, " %s %s", pol_names[p], plan_pct(plan_overhead(&pr, q)));
      else
        fprintf(out, " %s no", pol_names[p]);
      fprintf(out, p + 1 < POL_COUNT ? "," : "\n");
    }
  }
  plan_free_result(&pr);
  return 0;
}
