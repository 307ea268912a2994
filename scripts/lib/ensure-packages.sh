# shellcheck shell=bash
# Sourced by scripts/demo and scripts/test: make sure the Debian packages skim's build needs
# are installed, installing the missing ones with apt-get (as root, else through passwordless
# sudo); otherwise print the command to run and exit 1.
#
#   skim_ensure_packages [extra-package ...]
#
# SKIM_SKIP_PACKAGE_CHECK=1 skips the check (e.g. on a system without dpkg where the tools
# were installed some other way).

SKIM_DEBIAN_PACKAGES=(cmake g++ make libeigen3-dev libxsimd-dev doctest-dev libbenchmark-dev python3
  qemu-user g++-aarch64-linux-gnu  # these two: the NEON simd test (cross-build, run under qemu)
  clang-14 libclang-rt-14-dev)      # these two: the libFuzzer targets (scripts/fuzz, run briefly by scripts/test)

skim_ensure_packages() {
  if [[ "${SKIM_SKIP_PACKAGE_CHECK:-0}" == 1 ]]; then
    return 0
  fi
  if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "skim: no dpkg-query (not Debian/Ubuntu?); not checking packages." >&2
    echo "skim: needs: ${SKIM_DEBIAN_PACKAGES[*]} $* (or their equivalents)" >&2
    return 0
  fi

  local pkg missing=()
  for pkg in "${SKIM_DEBIAN_PACKAGES[@]}" "$@"; do
    # "install ok installed" only when the package is fully installed (not just known/removed).
    if [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" != "install ok installed" ]]; then
      missing+=("$pkg")
    fi
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi

  local -a sudo=()
  if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      echo "skim: missing packages: ${missing[*]}" >&2
      echo "skim: install them with:" >&2
      echo "  sudo apt-get install -y ${missing[*]}" >&2
      exit 1
    fi
  fi
  echo "skim: installing missing packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
