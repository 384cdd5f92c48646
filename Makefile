# `make run` and `make test` set everything up on a fresh Debian machine (as root,
# with PyPI and Debian's packages reachable), then start the studio or run every test.

PYTHON   ?= python3
VENV     := .venv
PY       := $(VENV)/bin/python
BUILD    := build/native
# GPU=cuda or GPU=vulkan builds ggml with that backend (also the engine's CPU backend).
# CUDA with CUDA graphs: ggml captures a graph the engine keeps between calls and replays it
# in one launch.
GPU      ?=
GGML_CMAKE_ARGS := -DGGML_LLAMAFILE=ON $(if $(filter cuda,$(GPU)),-DGGML_CUDA=ON -DGGML_CUDA_GRAPHS=ON) \
	$(if $(filter vulkan,$(GPU)),-DGGML_VULKAN=ON)
# One stamp per backend and ggml options, so that changing either rebuilds ggml.
STAMP    := $(VENV)/.deps-stamp-$(or $(GPU),cpu)-$(shell echo '$(GGML_CMAKE_ARGS)' | cksum | cut -d' ' -f1)

CPP_SOURCES = $(wildcard native/include/*.h native/src/*.h native/src/*.cpp native/src/graph/*.h native/src/graph/*.cpp native/src/cpu/*.h native/src/cpu/*.cpp native/src/cpu/*.inc native/src/models/*/*.h native/src/models/*/*.cpp native/src/cuda/*.cuh native/src/cuda/*.cu native/tools/*.cpp \
	native/tests/*.h native/tests/*.c native/tests/*.cpp native/python/*.h native/python/*.cpp packaging/runtime/*.c)

# Vulkan headers for ggml's Vulkan backend where the system's are too old (Debian 12's):
# Debian 13's libvulkan-dev, unpacked here (headers only; the loader stays the system's).
VK_HEADERS := $(VENV)/vulkan-headers
VK_CMAKE_ARGS = $$([ "$(GPU)" = vulkan ] && [ -d $(VK_HEADERS) ] && echo -DVulkan_INCLUDE_DIR=$(abspath $(VK_HEADERS))/usr/include)

export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc)

.PHONY: run test setup system-deps engine models ggml-avx2 lint format native-test fuzz-short fuzz sanitize py-test desktop \
	bench-startup bundle bundle-deps bundle-test bundle-cuda bundle-cuda-test clean

run: setup
	$(PY) main.py

test: setup lint native-test fuzz-short py-test sanitize

setup: system-deps $(STAMP) engine models

# Shared libraries the Python packages load at run time (PortAudio for sounddevice,
# what Qt's offscreen platform links against), and for the playback tests a PulseAudio
# daemon, its recorder and ALSA's pulse plugin (PortAudio reaches PulseAudio through
# it); each installed only when missing.
SYSTEM_LIBS := libportaudio.so.2:libportaudio2 libEGL.so.1:libegl1 libGL.so.1:libgl1 \
	libxkbcommon.so.0:libxkbcommon0 libfontconfig.so.1:libfontconfig1 libdbus-1.so.3:libdbus-1-3 \
	libglib-2.0.so.0:libglib2.0-0
SYSTEM_CMDS := c++:g++ pulseaudio:pulseaudio parec:pulseaudio-utils
# Vulkan: the loader at run time, its headers, SPIR-V's headers and glslc to build ggml's
# shaders, and Mesa's drivers (AMD's and Intel's GPUs).
ifeq ($(GPU),vulkan)
SYSTEM_LIBS += libvulkan.so.1:libvulkan1 libvulkan_lvp.so:mesa-vulkan-drivers
SYSTEM_CMDS += glslc:glslc
endif
ifneq ($(filter-out cuda vulkan,$(GPU)),)
$(error GPU must be cuda or vulkan (or empty for the CPU), not '$(GPU)')
endif
system-deps:
	@missing=""; for pair in $(SYSTEM_LIBS); do lib=$${pair%%:*}; pkg=$${pair##*:}; \
	  ldconfig -p | grep -q "$$lib" || missing="$$missing $$pkg"; done; \
	for pair in $(SYSTEM_CMDS); do cmd=$${pair%%:*}; pkg=$${pair##*:}; \
	  command -v $$cmd >/dev/null || missing="$$missing $$pkg"; done; \
	ls /usr/lib/*/alsa-lib/libasound_module_pcm_pulse.so >/dev/null 2>&1 || missing="$$missing libasound2-plugins"; \
	if [ "$(GPU)" = vulkan ]; then [ -f /usr/include/vulkan/vulkan.h ] || missing="$$missing libvulkan-dev"; \
	  [ -d /usr/share/cmake/SPIRV-Headers ] || missing="$$missing spirv-headers"; fi; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi

$(STAMP): pyproject.toml tools/requirements.py
	@if [ "$(GPU)" = cuda ] && ! command -v nvcc >/dev/null; then \
	  echo "GPU=cuda needs NVIDIA's CUDA toolkit (nvcc on PATH): install it from NVIDIA, or Debian's non-free nvidia-cuda-toolkit"; \
	  exit 1; fi
	@if [ "$(GPU)" = vulkan ] && ! grep -q VkLayerSettingEXT /usr/include/vulkan/vulkan_core.h \
	  && ! [ -f $(VK_HEADERS)/usr/include/vulkan/vulkan_core.h ]; then \
	  echo "GPU=vulkan: ggml's Vulkan backend needs Vulkan headers with VK_EXT_layer_settings (2023); the system's are"; \
	  echo "1.3.$$(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\).*/\1/p' /usr/include/vulkan/vulkan_core.h): unpacking Debian 13's libvulkan-dev into $(VK_HEADERS)"; \
	  d=$$(mktemp -d) && chmod 755 $$d && mkdir -p $$d/lists/partial $$d/cache/archives/partial && \
	  archive=$$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -n 1); \
	  [ -n "$$archive" ] || archive=$$(awk '$$1 == "deb" && $$2 !~ /security/ { print $$2; exit }' /etc/apt/sources.list 2>/dev/null); \
	  [ -n "$$archive" ] || { echo "GPU=vulkan: no Debian archive in this machine's apt sources"; exit 1; }; \
	  echo "deb $$archive trixie main" > $$d/trixie.list && \
	  apt="-o Dir::Etc::SourceList=$$d/trixie.list -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists=$$d/lists -o Dir::Cache=$$d/cache" && \
	  apt-get $$apt update -qq && (cd $$d && apt-get $$apt download -qq libvulkan-dev 2>/dev/null) && \
	  mkdir -p $(VK_HEADERS) && dpkg -x $$d/libvulkan-dev_*.deb $(VK_HEADERS) && rm -rf $$d; fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) tools/requirements.py test > $(VENV)/requirements.txt
	# ggml is compiled here from ggml-python's sdist, with its tiled matmul kernels and the chosen
	# GPU backend; --no-cache-dir keeps a wheel built with other options from being reused, and
	# --force-reinstall rebuilds it when only the backend changed.
	rm -f $(VENV)/.deps-stamp-*
	CMAKE_ARGS="$(GGML_CMAKE_ARGS) $(VK_CMAKE_ARGS)" $(PY) -m pip install -q --no-cache-dir --no-deps --force-reinstall \
	  "$$(grep '^ggml-python==' $(VENV)/requirements.txt | head -n 1)"
	$(PY) -m pip install -q -r $(VENV)/requirements.txt
	touch $@

engine: $(STAMP)
	$(VENV)/bin/cmake -S native -B $(BUILD) -G Ninja -DPython_EXECUTABLE=$(abspath $(PY)) -DCMAKE_BUILD_TYPE=Release >/dev/null
	$(VENV)/bin/cmake --build $(BUILD)

models: engine
	$(PY) main.py models install
	$(PY) main.py models install kokoro speaker-encoder

# For `tools/cpu_table.py --isa avx2` (a CPU without AVX-512, emulated): ggml of the pinned
# ggml-python's source built for AVX2 and FMA alone, its libraries in build/ggml-avx2 (the source
# is built in a temporary folder and removed).
# The pinned ggml-python's source archive downloaded into the folder $$d; ggml's portable CPU
# build (the CPU app's, and the CUDA app's beside its CUDA backend).
GGML_SDIST = $(PY) -m pip download -q --no-deps --no-binary :all: -d $$d "$$(grep '^ggml-python==' $(VENV)/requirements.txt | head -n 1)"
GGML_PORTABLE := -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
	-DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_LLAMAFILE=ON -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF
GGML_AVX2 := build/ggml-avx2
ggml-avx2: $(GGML_AVX2)/libggml.so
$(GGML_AVX2)/libggml.so: $(STAMP)
	@d=$$(mktemp -d) && trap 'rm -rf $$d' EXIT && $(GGML_SDIST) && \
	mkdir $$d/src && tar xzf $$d/ggml_python-*.tar.gz -C $$d/src --strip-components=1 && \
	$(VENV)/bin/cmake -S $$d/src/vendor/ggml -B $$d/build -G Ninja $(GGML_PORTABLE) >/dev/null && \
	$(VENV)/bin/cmake --build $$d/build && rm -rf $(GGML_AVX2) && mkdir -p $(GGML_AVX2) && \
	cp -P $$d/build/src/*.so* $(GGML_AVX2)/ && echo "ggml for AVX2 and FMA: $(GGML_AVX2)"

lint: $(STAMP)
	$(VENV)/bin/ruff check app tests tools packaging main.py
	$(VENV)/bin/ruff format --check app tests tools packaging main.py
	$(VENV)/bin/clang-format --dry-run --Werror $(CPP_SOURCES)

format: $(STAMP)
	$(VENV)/bin/ruff format app tests tools packaging main.py
	$(VENV)/bin/ruff check --fix app tests tools packaging main.py
	$(VENV)/bin/clang-format -i $(CPP_SOURCES)

native-test: engine models
	cd $(BUILD) && VS_TEST_MODEL="$$($(abspath $(PY)) -c 'import sys; sys.path.insert(0, "$(CURDIR)"); from app.models import manager as models; print(models.installed_path("piper:joe"))')" \
	  $(abspath $(VENV))/bin/ctest --output-on-failure

py-test: engine models
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q --durations=20

# The fuzzers (tools/fuzz.py): each target for a few seconds in `make test`, for ten minutes
# (FUZZ_SECONDS) here. A crash leaves its input in build/fuzz/fuzz-crash-input.
FUZZ_SECONDS ?= 600
fuzz-short: engine models
	mkdir -p build/fuzz && cd build/fuzz && $(abspath $(PY)) $(CURDIR)/tools/fuzz.py --seconds 4
fuzz: engine models
	mkdir -p build/fuzz && cd build/fuzz && $(abspath $(PY)) $(CURDIR)/tools/fuzz.py --seconds $(FUZZ_SECONDS)

# The engine under AddressSanitizer and UndefinedBehaviorSanitizer: its native tests, the
# fuzzers' native targets, and the tests of hostile input through Python (the instrumented
# binding is loaded from build/asan/overlay, whose app package extends the real one). Line
# tables alone for debug information (-g1): reports name functions and lines, and the build
# takes a third less time.
ASAN_BUILD := build/asan
SANITIZE_ENV = ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
sanitize: setup
	mkdir -p $(ASAN_BUILD)/overlay/app
	printf '__path__.append("%s")\n' "$(CURDIR)/app" > $(ASAN_BUILD)/overlay/app/__init__.py
	$(VENV)/bin/cmake -S native -B $(ASAN_BUILD) -G Ninja -DPython_EXECUTABLE=$(abspath $(PY)) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
	  -DVS_SANITIZE=ON -DVS_PYTHON_OUTPUT_DIR=$(abspath $(ASAN_BUILD))/overlay/app >/dev/null
	$(VENV)/bin/cmake --build $(ASAN_BUILD)
	cd $(ASAN_BUILD) && $(SANITIZE_ENV) VS_TEST_MODEL="$$($(abspath $(PY)) -c 'import sys; sys.path.insert(0, "$(CURDIR)"); from app.models import manager as models; print(models.installed_path("piper:joe"))')" \
	  $(abspath $(VENV))/bin/ctest --output-on-failure
	cd $(ASAN_BUILD) && $(SANITIZE_ENV) $(abspath $(PY)) $(CURDIR)/tools/fuzz.py --seconds 5 --driver $(abspath $(ASAN_BUILD))/fuzz-engine \
	  gguf-piper gguf-ge2e phonemes-piper phonemes-kokoro text-piper text-kokoro
	cd $(ASAN_BUILD)/overlay && $(SANITIZE_ENV) LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	  QT_QPA_PLATFORM=offscreen $(abspath $(PY)) -m pytest -q -p no:cacheprovider -m "not slow" --rootdir $(CURDIR) \
	  $(CURDIR)/tests/test_hostile_models.py $(CURDIR)/tests/test_synthesis.py

# A launcher in the desktop's application menu (and on the desktop when there is one).
DESKTOP_DIR ?= $(HOME)/.local/share/applications
desktop: setup
	mkdir -p "$(DESKTOP_DIR)"
	sed -e "s|@PYTHON@|$(abspath $(PY))|" -e "s|@ROOT@|$(CURDIR)|g" packaging/voicestudio.desktop.in \
	  > "$(DESKTOP_DIR)/voicestudio.desktop"
	chmod +x "$(DESKTOP_DIR)/voicestudio.desktop"
	if [ -d "$(HOME)/Desktop" ]; then cp "$(DESKTOP_DIR)/voicestudio.desktop" "$(HOME)/Desktop/"; fi
	@echo "installed $(DESKTOP_DIR)/voicestudio.desktop"

# The Linux app (packaging/build_bundle.py: PyInstaller's build as an AppDir, with ggml's AVX2
# build and the stock voices, made an AppImage with the runtime of packaging/runtime), and its
# smoke test as a user meets it (packaging/smoke_test.py, by the system's python3: no venv, no
# checkout on its path). The bundle takes the X11 libraries Qt's xcb plugin links against from
# this machine; the runtime links squashfuse, libfuse3 and the decompressors statically.
BUNDLE_LIBS := libxcb-icccm.so.4:libxcb-icccm4 libxcb-keysyms.so.1:libxcb-keysyms1 libxcb-image.so.0:libxcb-image0 \
	libxcb-render-util.so.0:libxcb-render-util0 libxcb-xkb.so.1:libxcb-xkb1 libxkbcommon-x11.so.0:libxkbcommon-x11-0 \
	libxcb-cursor.so.0:libxcb-cursor0 libxcb-randr.so.0:libxcb-randr0 libxcb-shape.so.0:libxcb-shape0
RUNTIME_DEV := squashfuse/ll.h:libsquashfuse-dev fuse3/fuse_lowlevel.h:libfuse3-dev zstd.h:libzstd-dev zlib.h:zlib1g-dev \
	lzma.h:liblzma-dev lz4.h:liblz4-dev lzo/lzo1x.h:liblzo2-dev
RUNTIME := build/bundle/runtime
RUNTIME_LIBS := -Wl,-Bstatic -lsquashfuse_ll -lsquashfuse -lfuse3 -lzstd -lz -llzma -llz4 -llzo2 -Wl,-Bdynamic -lpthread -ldl
bundle-deps:
	@missing=""; for pair in $(BUNDLE_LIBS); do lib=$${pair%%:*}; pkg=$${pair##*:}; \
	  ldconfig -p | grep -q "$$lib" || missing="$$missing $$pkg"; done; \
	for pair in $(RUNTIME_DEV); do h=$${pair%%:*}; pkg=$${pair##*:}; \
	  [ -f /usr/include/$$h ] || missing="$$missing $$pkg"; done; \
	command -v mksquashfs >/dev/null || missing="$$missing squashfs-tools"; \
	command -v fusermount3 >/dev/null || missing="$$missing fuse3"; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi

$(RUNTIME): packaging/runtime/runtime.c | bundle-deps
	mkdir -p $(dir $@)
	cc -O2 -Wall -Wextra -Werror -D_FILE_OFFSET_BITS=64 -DFUSE_USE_VERSION=32 $< -o $@ $(RUNTIME_LIBS)
	strip $@

bundle: setup ggml-avx2 bundle-deps $(RUNTIME)
	$(PY) -m pip install -q $$($(PY) tools/requirements.py bundle | grep -i '^pyinstaller')
	$(PY) packaging/build_bundle.py --ggml $(GGML_AVX2) --runtime $(RUNTIME)

bundle-test: bundle
	python3 packaging/smoke_test.py

# The CUDA app, a second AppImage: the CPU app with the engine built for NVIDIA GPUs
# (packaging/build_cuda.py: ggml's CUDA backend and the engine's CUDA kernels) and the CUDA
# runtime's libraries. Needs NVIDIA's CUDA toolkit with cuBLAS; CUDA_ARCHS="90-real" (say)
# builds for fewer GPUs, faster. Not part of `make test`: CI has no CUDA toolkit.
CUDA_BUILD := build/cuda
bundle-cuda: bundle
	@d=$$(mktemp -d) && trap 'rm -rf $$d' EXIT && $(GGML_SDIST) && \
	$(PY) packaging/build_cuda.py --sdist $$d/ggml_python-*.tar.gz --ggml-options "$(GGML_PORTABLE)" --out $(CUDA_BUILD) \
	  $(if $(CUDA_ARCHS),--archs "$(CUDA_ARCHS)")
	$(PY) packaging/build_bundle.py --runtime $(RUNTIME) --cuda $(CUDA_BUILD)

# Its smoke test, on a machine with an NVIDIA GPU: the same as the CPU app's, synthesizing on the GPU.
bundle-cuda-test: bundle-cuda
	python3 packaging/smoke_test.py --device cuda0 build/bundle/VoiceStudio-*-x86_64-cuda.AppImage

bench-startup: setup
	QT_QPA_PLATFORM=$${QT_QPA_PLATFORM:-offscreen} $(PY) tools/bench_startup.py

clean:
	rm -rf build app/_engine*.so
