/*
 * schedule.h — the denoising schedule from JSON text already in memory:
 * the generator's presets carry their model_index.json additions and
 * scheduler config as strings, and a preset declared without files
 * (mlo_synth_declare) gets its schedule from them, by the same rules
 * mlo_denoise_schedule_read applies to files.
 */
#ifndef MLO_FORMAT_SCHEDULE_H
#define MLO_FORMAT_SCHEDULE_H

#include "mlo/checkpoint.h"

/* index_json: model_index.json's object (its boundary_ratio is read);
 * scheduler_json: scheduler_config.json's, or NULL for the default.  Only
 * for trusted text (the preset tables): files go through
 * mlo_denoise_schedule_read and the strict reader. */
int mlo_denoise_schedule_parse(const char *index_json, const char *scheduler_json,
                               mlo_denoise_schedule *out, char *err, size_t errlen);

#endif
