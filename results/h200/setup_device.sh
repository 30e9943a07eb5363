#!/bin/bash
# On the GPU machine (torch 2.11 cu130, nvcc 13, Python 3.12, no network): lay out sglang 0.5.17's kernel
# runtime under /tmp/site from the folder prepare-sglang-carry.sh made, carried as ./.carry.
set -euo pipefail
site=/tmp/site
if [ ! -f $site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .carry/whl/*.whl
  python3 -c "
import glob, zipfile
wheel = zipfile.ZipFile(glob.glob('.carry/sglang-0.5.17-*.whl')[0])
wheel.extractall('$site', [n for n in wheel.namelist() if n.startswith('sglang/')])"
  tar xzf .carry/sgl_kernel_sm90.tgz -C $site
  # sglang's kernel modules import IPython.display for notebook pretty-printing only
  mkdir -p $site/IPython
  : > $site/IPython/__init__.py
  printf 'def display(*a, **k):\n    pass\n\n\nclass HTML:\n    def __init__(self, *a, **k):\n        pass\n' > $site/IPython/display.py
  touch $site/.done
fi
echo setup-ok
