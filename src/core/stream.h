/*
 * stream.h — a streamed component's plan and slots, shared by the two
 * halves of block streaming: stream_plan.c (the geometry: which blocks
 * stay, where everything sits in the footprint) and stream.c (the slots at
 * run time).  Nothing else in the core sees these structs
 * (docs/streaming.md).
 */
#ifndef MLO_CORE_STREAM_H
#define MLO_CORE_STREAM_H

#include "core/internal.h"

#define STREAMED UINT64_MAX /* dev_off of a block that is not resident */

struct stream_slot {
  uint64_t dev_off;
  long blk;           /* the block it holds or is loading; -1: none */
  int users;          /* begins not ended: several threads may run one block */
  pthread_t *holders; /* the thread of each (users entries) */
  size_t hcap;
  bool waited;      /* compute has waited for its load already */
  bool has_free_ev; /* free_ev recorded since the slot was last filled */
  bool reading;     /* its block is being read from disk into it (mlo_disk_read_block) */
  int read_rc;      /* how that read went (read_err says why it failed) */
  char read_err[256];
  mlo_event *load_ev, *free_ev;
};

struct mlo_stream {
  uint64_t room;       /* the budget it was planned for */
  uint64_t footprint;  /* device bytes while resident */
  uint64_t resident;   /* of which the resident part (copied at load) */
  uint64_t slot_bytes; /* each slot: the largest streamed block, aligned */
  uint64_t pro_dev, epi_dev, ext_dev, ext_start;
  uint64_t *dev_off; /* per block: where it is resident, or STREAMED */
  size_t *order;     /* the streamed blocks in the order they run */
  size_t *pos;       /* per block: its place in order (streamed ones) */
  size_t nstreamed, nresident;
  uint64_t streamed_bytes; /* moved per forward */
  struct stream_slot *slots;
  size_t nslots;
  size_t next; /* the place in order of the next block to issue */
};

#endif
