# Sourced by the setup scripts: apt_install LABEL PACKAGE... installs the Debian packages not yet
# installed (one apt-get run, as root or through sudo) and says what it did, prefixed with LABEL.
apt_install() {
  local label="$1"
  shift
  local sudo="" missing=() p
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "$label: all Debian packages present"
    return 0
  fi
  echo "$label: installing ${missing[*]}"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
