// The source tree hyperion was built from: where presets (configs/) and the bundled
// corpus (data/) are found when the working directory is not the source tree. Defined
// in a file generated at configure time (one small translation unit, so no other file's
// compiler cache depends on where the tree is).
#pragma once

namespace hyperion {

const char* source_dir();

}  // namespace hyperion
