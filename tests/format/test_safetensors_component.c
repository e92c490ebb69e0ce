/*
 * test_safetensors_component.c — a checkpoint file declared in a component.
 *
 * mlo_st_add_to_component is where the reader meets the core: each tensor
 * becomes a file range that materialization reads straight into the slab.
 * The check is end to end: after materialize, every tensor's host bytes
 * must be the bytes written (unaligned offsets included), and a refusal
 * by the core must come back as a message naming the file and the tensor.
 */
#include "testutil.h"

#include "format/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char path[256];

static int write_file(void **state) {
  (void)state;
  snprintf(path, sizeof path, "/tmp/mlo_st_comp_XXXXXX");
  int fd = mkstemp(path);
  if (fd < 0) return -1;
  close(fd);
  return 0;
}

static int remove_file(void **state) {
  (void)state;
  return unlink(path);
}

#define NT 5
static const char *names[NT] = {"odd", "w", "scalar", "empty", "bf"};
static const mlo_dtype dtypes[NT] = {MLO_DTYPE_U8, MLO_DTYPE_F32, MLO_DTYPE_F64, MLO_DTYPE_F16,
                                     MLO_DTYPE_BF16};
static const int ndims[NT] = {1, 2, 0, 2, 1};
static const int64_t shapes[NT][2] = {{3, 0}, {4, 5}, {0, 0}, {0, 7}, {33, 0}};

static uint8_t *expected(int i, uint64_t *n) {
  uint64_t numel = 1;
  for (int k = 0; k < ndims[i]; k++) numel *= (uint64_t)shapes[i][k];
  assert_int_equal(mlo_dtype_nbytes(dtypes[i], numel, n), MLO_OK);
  uint8_t *p = malloc(*n ? *n : 1);
  for (uint64_t b = 0; b < *n; b++) p[b] = (uint8_t)(i * 29 + b * 3 + 1);
  return p;
}

static void test_file_tensors_materialize(void **state) {
  (void)state;
  mlo_st_writer *w;
  assert_ok(mlo_st_writer_create(&w));
  uint8_t *data[NT];
  uint64_t nb[NT];
  for (int i = 0; i < NT; i++) {
    data[i] = expected(i, &nb[i]);
    assert_ok(mlo_st_writer_add(w, names[i], dtypes[i], ndims[i], shapes[i], data[i], nb[i], true));
  }
  char err[512];
  assert_ok(mlo_st_writer_write(w, path, err, sizeof err));
  mlo_st_writer_free(w);

  mlo_platform *plat = tu_platform_open(NULL);
  mlo_pipeline_options o = MLO_PIPELINE_OPTIONS_INIT;
  o.platform = plat;
  mlo_pipeline *pipe;
  assert_ok(mlo_pipeline_create(&o, &pipe));
  mlo_component *comp;
  assert_ok(mlo_component_add(pipe, "text_encoder", MLO_ROLE_ENCODER, &comp));
  mlo_st_file *f;
  assert_ok(mlo_st_open(path, &f, err, sizeof err));
  assert_ok(mlo_st_add_to_component(f, comp, MLO_TENSOR_PARAMETER, err, sizeof err));
  assert_int_equal(mlo_component_tensor_count(comp), NT);

  /* declaring twice: the core refuses, the message names file and tensor */
  assert_int_equal(mlo_st_add_to_component(f, comp, 0, err, sizeof err), MLO_EEXIST);
  char want[600];
  snprintf(want, sizeof want, "%s: tensor 'odd': cannot add to component 'text_encoder'", path);
  if (strncmp(err, want, strlen(want)) != 0) fail_msg("message \"%s\"", err);
  mlo_st_close(f);

  assert_ok(mlo_pipeline_materialize(pipe));
  for (int i = 0; i < NT; i++) {
    mlo_tensor *t = mlo_component_find_tensor(comp, names[i]);
    assert_non_null(t);
    assert_int_equal(mlo_tensor_dtype(t), dtypes[i]);
    assert_int_equal(mlo_tensor_ndim(t), ndims[i]);
    for (int k = 0; k < ndims[i]; k++) assert_int_equal(mlo_tensor_shape(t)[k], shapes[i][k]);
    assert_int_equal(mlo_tensor_nbytes(t), nb[i]);
    if (nb[i]) {
      const void *host = mlo_tensor_host_data(t);
      assert_non_null(host);
      assert_memory_equal(host, data[i], nb[i]);
    }
    free(data[i]);
  }
  mlo_pipeline_free(pipe);
  mlo_platform_close(plat);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_file_tensors_materialize),
  };
  return cmocka_run_group_tests(tests, write_file, remove_file);
}
