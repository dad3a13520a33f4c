// AMX tile configuration shared by the AMX kernels (kernels/amx_int8_gemm.cc) and the
// peak measurement (kernels/peak.cc): palette 1, tiles 0-7 all at their largest shape,
// 16 rows x 64 bytes. Callers must hold the OS permission (base/cpu.h request_amx).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace hyperion {

struct alignas(64) AmxTileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Loads the configuration on the calling thread (each thread that runs tiles needs it).
__attribute__((target("amx-tile"))) inline void amx_configure_full_tiles() {
  AmxTileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

}  // namespace hyperion
