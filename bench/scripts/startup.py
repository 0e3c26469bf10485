"""Start-up probe: what every training script does first, `import torch`, then the time
stamp on the very next line. The benchmark's figure is launch -> the LAST rank's stamp."""
import torch  # noqa: F401  (the point: the rank is ready to train only once this is done)
import time; _t = time.time()  # noqa: E401,E702

from _stamp import rank, stamp

stamp("torch", rank(), t=_t)
