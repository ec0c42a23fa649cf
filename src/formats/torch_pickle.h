/* PyTorch's meaning of pickled names, for the unpickler of pickle.h: what a
 * GLOBAL resolved to (bs_pv.u.glob.kind) and torch's storage classes. */
#ifndef BURNSTORE_TORCH_PICKLE_H
#define BURNSTORE_TORCH_PICKLE_H

#include <stdbool.h>

#include "core/dtype.h"
#include "formats/pickle.h"

/* What a GLOBAL resolved to. */
enum bs_pg {
  BS_PG_OPAQUE, /* unknown: never called; REDUCE/NEWOBJ make an opaque object */
  BS_PG_ORDERED_DICT,
  BS_PG_REBUILD_V2, /* torch._utils._rebuild_tensor_v2 */
  BS_PG_REBUILD_V3,
  BS_PG_REBUILD_LEGACY, /* torch._utils._rebuild_tensor (4 args) */
  BS_PG_REBUILD_QTENSOR,
  BS_PG_REBUILD_OTHER, /* other torch._utils._rebuild_*: unsupported tensor */
  BS_PG_PARAMETER,     /* _rebuild_parameter, _rebuild_parameter_with_state */
  BS_PG_FROM_TYPE_V2,  /* torch._tensor._rebuild_from_type_v2 */
  BS_PG_STORAGE,       /* torch.*Storage (by name alone) */
  BS_PG_DTYPE,         /* torch.float16 etc. */
  BS_PG_SIZE,          /* torch.Size */
  BS_PG_DEVICE,        /* torch.device */
  BS_PG_TENSOR_CLASS,  /* torch.Tensor / torch.nn.parameter.Parameter (as a class value) */
  BS_PG_CODECS_ENCODE, /* _codecs.encode */
  BS_PG_SET,
  BS_PG_FROZENSET,
  BS_PG_COMPLEX,
  BS_PG_BYTEARRAY,
  BS_PG_RECONSTRUCTOR, /* copyreg._reconstructor(cls, base, state) */
  BS_PG_NAMESPACE,     /* argparse.Namespace: NEWOBJ + BUILD, harmless */
  BS_PG_NN_MODULE,     /* torch.nn.modules.*: a whole pickled module, refused */
  BS_PG_INERT,         /* known harmless value (qscheme, torch.memory_format, ...) */
  BS_PG_COUNT
};

/* Storage class name ("FloatStorage") -> element size (0 if unknown) and,
 * when burnstore has one, its dtype. Returns true if the dtype is known. */
bool bs_pickle_storage_dtype(const char *name, unsigned *esize, enum bs_dtype *dt);

#endif
