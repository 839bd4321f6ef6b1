"""``python -m verl_gigpo.export CKPT --out HF_DIR`` (see :mod:`verl_gigpo.export`)."""

import sys

from verl_gigpo.export import main

sys.exit(main())
