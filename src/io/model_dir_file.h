// The files of a model directory (a checkpoint, a Hugging Face model or tokenizer
// directory) are untrusted input, and so is where they point. A file is named by a plain
// file name (no '/', not "." or ".."), and a symbolic link among them is followed only to
// a file inside the directory, or, when the directory is a Hugging Face hub snapshot
// (.../models--ORG--NAME/snapshots/REVISION, whose files are links to ../../blobs/HASH),
// to a file in that repository's blobs/. Any other link is refused by name: a model
// directory never makes hyperion read a file elsewhere (as '../' and absolute paths in an
// index are refused).
#pragma once

#include <string>

namespace hyperion::io {

// dir/name, checked as above; throws hyperion::Error naming the file and where it points.
// A name that is not there is returned as is (its reader says it is missing).
std::string model_dir_file(const std::string& dir, const std::string& name);

}  // namespace hyperion::io
