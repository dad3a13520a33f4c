// `hyperion train` for a recommender (model_type: dlrm; configs/dlrm-tiny.yml): the DLRM
// of recsys/dlrm_model.h trained with the language-model trainer's run directory and
// lock, schedule, metrics.jsonl (plus samples_per_s, auc, eval_loss), monitoring (event
// log, Prometheus, stragglers, goodput, stack dumps), graceful stop on SIGTERM and
// checkpoints in the same layout:
//
//   <run dir>/checkpoints/<step>/
//     model.safetensors        dense tensors (bottom_mlp.*, cross.*, top_mlp.*) and the
//                              tables (embedding_bags.t_cat_<t>.weight)
//     optimizer.safetensors    Adagrad state: "<tensor>.sum"
//     trainer_state.json       step, examples seen, data position, resolved config
// With N ranks, rank r writes model-<r+1>-of-<N>.safetensors and optimizer-<r+1>-of-
// <N>.safetensors (its tables or row blocks; rank 0 the dense tensors) and rank 0 the
// model.safetensors.index.json; any rank count and placement resumes from either form.
//
// Data: dataset_path empty trains on the synthetic task (recsys/synthetic_data.h,
// example i of the stream at step s, rank r: s * B * N + r * B + i); a Criteo TSV file
// (recsys/criteo_reader.h) is read in order, each rank taking its slice of every global
// batch of B * N lines. Held-out AUC every eval_interval steps and at the end.
#pragma once

#include <string>

#include "base/config.h"
#include "dist/communicator.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace hyperion {

TrainResult run_recsys_training(const Config& config, const TrainConfig& t,
                                const TrainOptions& options, dist::Communicator& comm,
                                double process_start);

}  // namespace hyperion
