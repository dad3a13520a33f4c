// The hooks a model calls at parameter-bucket boundaries (see ParamStore::bucket_range).
#pragma once

namespace hyperion {

// Called by the model at parameter-bucket boundaries (ParamStore::bucket_range), so a
// data-parallel or FSDP trainer can overlap communication with compute: gather a
// bucket's parameters just before use and prefetch the next, reduce a bucket's
// gradients as soon as its backward is done.
class BucketHooks {
 public:
  virtual ~BucketHooks() = default;
  // Bucket b's parameters are about to be read; `next` is the bucket read after it
  // (-1: none in this pass).
  virtual void use(int b, int next) = 0;
  // Done reading b for now; `again` when the model reads it again right after the next
  // bucket (the last layer between forward and backward).
  virtual void done(int b, bool again) = 0;
  // Bucket b's gradient for this micro-batch is complete.
  virtual void grads_ready(int b) = 0;
};

}  // namespace hyperion
