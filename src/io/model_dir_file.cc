#include "io/model_dir_file.h"

#include <filesystem>

#include "base/error.h"

namespace hyperion::io {
namespace {

namespace fs = std::filesystem;

// Whether `p` is `root` or lies under it (both canonical).
bool inside(const fs::path& p, const fs::path& root) {
  auto r = root.begin(), q = p.begin();
  for (; r != root.end(); ++r, ++q)
    if (q == p.end() || *q != *r) return false;
  return true;
}

}  // namespace

std::string model_dir_file(const std::string& dir, const std::string& name) {
  HYP_CHECK(!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos,
            "{}: '{}' is not a file name in the model directory", dir, name);
  const fs::path path = fs::path(dir) / name;
  std::error_code ec;
  if (!fs::is_symlink(path, ec)) return path.string();
  const fs::path root = fs::canonical(dir.empty() ? std::string(".") : dir, ec);
  HYP_CHECK(!ec, "{}: cannot resolve the model directory: {}", dir, ec.message());
  const fs::path target = fs::weakly_canonical(path, ec);
  HYP_CHECK(!ec, "{}: cannot resolve the symbolic link: {}", path.string(), ec.message());
  if (inside(target, root)) return path.string();
  // A hub snapshot's files link into the repository's blobs/.
  const fs::path snapshots = root.parent_path(), repo = snapshots.parent_path();
  const std::string repo_name = repo.filename().string();
  const bool hub = snapshots.filename() == "snapshots" &&
                   (repo_name.rfind("models--", 0) == 0 || repo_name.rfind("datasets--", 0) == 0);
  if (hub && inside(target, repo / "blobs")) return path.string();
  fail("{}: a symbolic link to {}, outside the model directory{}: hyperion reads a model "
       "directory's own files only (copy the file in, or give the directory it is in)",
       path.string(), target.string(),
       hub ? " and its hub repository's blobs/" : "");
}

}  // namespace hyperion::io
