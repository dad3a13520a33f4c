// The diffusion side of `hyperion generate` (a directory with model_index.json).
#pragma once

#include "cli/flags.h"

namespace hyperion::cli {

// Generates the images `generate`'s flags ask for and writes them as PNG files.
int generate_image(const Flags& f);

}  // namespace hyperion::cli
