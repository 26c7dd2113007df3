/* nibble: the public C API in one include.
 * The Lua FFI declarations are generated from these headers at build time: keep them
 * free of macros in declarations and of inline function bodies. */
#ifndef NIBBLE_H
#define NIBBLE_H

#include "nibble/status.h"
#include "nibble/ctx.h"
#include "nibble/comm.h"
#include "nibble/dtype.h"
#include "nibble/tensor.h"
#include "nibble/safetensors.h"
#include "nibble/gguf.h"
#include "nibble/cuda.h"
#include "nibble/tokenizer.h"
#include "nibble/qmodel.h"
#include "nibble/export.h"
#include "nibble/ops.h"
#include "nibble/blas.h"
#include "nibble/model.h"
#include "nibble/generate.h"
#include "nibble/quant.h"
#include "nibble/formats.h"
#include "nibble/quant_fast.h"
#include "nibble/quant_cuda.h"
#include "nibble/parambuf.h"
#include "nibble/distill.h"
#include "nibble/optim.h"
#include "nibble/data.h"
#include "nibble/qad.h"

#endif
