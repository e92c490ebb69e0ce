/*
 * fault.h — the fault-injecting platform ("fault:kind=K,nth=N,inner=SPEC"),
 * internal.  It wraps any other platform and makes the Nth call of one kind
 * fail with the status a real device would give, exactly once, so that the
 * reliability tests (tests/reliability) can sweep a failure over every
 * platform call of an enable / forward / disable cycle and check that each
 * one is reported cleanly, rolled back, and survivable.
 *
 * Spec options (inner= must come last: the rest of the string is the inner
 * platform's own spec, commas and colons included):
 *   kind=dev_alloc|host_alloc|copy|event|sync|any   (default any)
 *   nth=N     fail the Nth call of that kind, counted from open; 0 = never
 *   inner=SPEC  the wrapped platform (default "host")
 * The wrapper reports the inner platform's name and capabilities, so the
 * workload and the tool treat it as the inner platform.
 */
#ifndef MLO_PLATFORM_FAULT_H
#define MLO_PLATFORM_FAULT_H

#include "platform/platform.h"

#include <stdbool.h>
#include <stdint.h>

/* The kinds of calls a fault can hit, and the status each fails with. */
typedef enum {
  MLO_FAULT_DEV_ALLOC,  /* dev_alloc            -> MLO_ENOMEM_DEVICE */
  MLO_FAULT_HOST_ALLOC, /* host_alloc (pinning) -> MLO_ENOMEM */
  MLO_FAULT_COPY,       /* copy_h2d, copy_d2h   -> MLO_EPLATFORM */
  MLO_FAULT_EVENT,      /* event create/record/wait/sync/query -> MLO_EPLATFORM */
  MLO_FAULT_SYNC,       /* synchronize          -> MLO_EPLATFORM */
  MLO_FAULT_KINDS,
  MLO_FAULT_ANY = MLO_FAULT_KINDS /* only as an arming choice: any kind */
} mlo_fault_kind;

/* "dev_alloc", "host_alloc", "copy", "event", "sync", "any". */
const char *mlo_fault_kind_name(mlo_fault_kind kind);
/* MLO_EINVAL for an unknown name. */
int mlo_fault_kind_from_name(const char *name, mlo_fault_kind *out);
/* The status a fault of this kind makes the call return. */
int mlo_fault_status(mlo_fault_kind kind);

/* Opens a platform by spec, as mlo_platform_open does. */
typedef int (*mlo_platform_open_fn)(const char *spec, mlo_platform **out, char *errbuf,
                                    size_t errlen);
/* The constructor of "fault:..." (registry.c's table calls it): the inner
 * platform is opened with open_inner (mlo_platform_open, handed down so
 * that this file calls nothing above it). */
int mlo_fault_platform_create(const char *spec_args, mlo_platform_open_fn open_inner,
                              mlo_platform *p, char *err, size_t errlen);

/* True when p is a fault platform (the functions below need one). */
bool mlo_fault_is(const mlo_platform *p);
/* The platform a fault wrapper wraps; NULL for any other platform. */
mlo_platform *mlo_fault_inner(mlo_platform *p);
/* Re-arms: zeroes the per-kind counts and makes the nth call of kind
 * (counted from now) fail once; nth 0 disarms and only counts. */
void mlo_fault_arm(mlo_platform *p, mlo_fault_kind kind, uint64_t nth);
/* Calls seen per kind since open or the last arm (counts[MLO_FAULT_KINDS]). */
void mlo_fault_counts(mlo_platform *p, uint64_t counts[MLO_FAULT_KINDS]);
/* While paused, calls are neither counted nor failed: a test's own reads of
 * device memory (its content checks) stay out of the sweep. */
void mlo_fault_pause(mlo_platform *p, bool paused);
/* Bytes the host-to-device copies that succeeded have queued since open,
 * counted below core (a paused test's own copies too): what core's
 * h2d_bytes must add up to. */
uint64_t mlo_fault_h2d_bytes(mlo_platform *p);
/* True once the armed fault has fired (it fires at most once per arm). */
bool mlo_fault_fired(mlo_platform *p);

#endif /* MLO_PLATFORM_FAULT_H */
