/*
 * consumer.c — a program outside the tree that uses an installed mlo the
 * way an integrator would: a host-backed device, a three-component pipeline
 * declared in code, offload enabled, forwards that read their weights on
 * the device.  Built by scripts/install-check.sh in C and (consumer.cpp) in
 * C++, statically and dynamically, through pkg-config and find_package.
 * Prints "consumer ok" and exits 0 only if every step did what it should.
 */
#include <mlo/checkpoint.h>
#include <mlo/mlo.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(expr)                                                                                \
  do {                                                                                             \
    int rc_ = (expr);                                                                              \
    if (rc_ != MLO_OK) {                                                                           \
      fprintf(stderr, "consumer: %s -> %s\n", #expr, mlo_err_name(rc_));                           \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

static float weights[3][256];

static int sum_forward(mlo_component *comp, void *user) {
  const float *w = (const float *)mlo_tensor_device_ptr(mlo_component_tensor_at(comp, 0));
  if (!w) return 1;
  double *sum = (double *)user;
  for (int i = 0; i < 256; i++) *sum += w[i];
  return 0;
}

int main(void) {
  char err[256];
  mlo_platform *dev = NULL;
  CHECK(mlo_platform_open("host:capacity=64K", &dev, err, sizeof err));
  mlo_pipeline_options po = MLO_PIPELINE_OPTIONS_INIT;
  po.platform = dev;
  mlo_pipeline *pipe = NULL;
  CHECK(mlo_pipeline_create(&po, &pipe));
  static const char *const names[3] = {"text_encoder", "transformer", "vae"};
  const mlo_role roles[3] = {MLO_ROLE_ENCODER, MLO_ROLE_DIT, MLO_ROLE_VAE};
  mlo_component *comps[3];
  for (int c = 0; c < 3; c++) {
    for (int i = 0; i < 256; i++) weights[c][i] = (float)(c + 1);
    CHECK(mlo_component_add(pipe, names[c], roles[c], &comps[c]));
    mlo_tensor_desc d = MLO_TENSOR_DESC_INIT;
    d.name = "weight";
    d.dtype = MLO_DTYPE_F32;
    d.ndim = 1;
    d.shape[0] = 256;
    d.data = weights[c];
    CHECK(mlo_tensor_add(comps[c], &d, NULL));
  }
  CHECK(mlo_offload_enable(pipe, NULL));
  double sums[3] = {0, 0, 0};
  for (int c = 0; c < 3; c++) CHECK(mlo_component_forward(comps[c], sum_forward, &sums[c]));
  CHECK(mlo_pipeline_audit(pipe));
  int ok = sums[0] == 256.0 && sums[1] == 512.0 && sums[2] == 768.0 &&
           !mlo_component_is_resident(comps[0]) && mlo_component_is_resident(comps[1]);
  mlo_pipeline_stats st;
  CHECK(mlo_pipeline_get_stats(pipe, &st));
  mlo_pipeline_free(pipe);
  mlo_platform_close(dev);
  if (!ok || st.total.d2h_bytes != 0) {
    fprintf(stderr, "consumer: wrong results\n");
    return 1;
  }
  /* A device platform is a module loaded on demand: where it or its runtime
   * is missing (CONSUMER_CUDA=absent: the check hid them), opening it is an
   * error that names what is missing, never a crash or a link failure. */
  mlo_platform *gpu = NULL;
  int grc = mlo_platform_open("cuda:0", &gpu, err, sizeof err);
  const char *want = getenv("CONSUMER_CUDA");
  if (grc == MLO_OK) {
    mlo_platform_close(gpu);
  } else if (!err[0] || grc == MLO_EINVAL) {
    fprintf(stderr, "consumer: cuda:0 failed without a reason (%s)\n", mlo_err_name(grc));
    return 1;
  }
  if (want && !strcmp(want, "absent") && (grc != MLO_ENODEV || !strstr(err, "libmlo-cuda"))) {
    fprintf(stderr, "consumer: cuda:0 without its module or runtime gave %s: %s\n",
            mlo_err_name(grc), err);
    return 1;
  }
  printf("consumer ok: mlo %s, %llu bytes loaded; cuda:0: %s\n", mlo_version(),
         (unsigned long long)st.total.h2d_bytes, grc ? err : "opened");
  return 0;
}
