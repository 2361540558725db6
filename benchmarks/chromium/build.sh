#!/bin/bash
# A portable headless Chromium for the GPU machine (no apt, no network there): Debian 12's
# chromium-headless-shell with every library it loads (but glibc's), a font and a launcher, packed as
# .chrome/part-1..3 (at most 20, 38 and 45 MB: each travels in one device call) and .chrome/assemble.sh.
#   bash benchmarks/chromium/build.sh [BUILD_DIR [DEB]]     # on this machine (Debian 12, root); README.md beside it
set -euo pipefail
OUT=${1:-/tmp/chrome_build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd -P)
TEMPLATE=$(cd "$(dirname "$0")" && pwd -P)/assemble.sh.in
[[ -d /usr/lib/chromium ]] || apt-get install -y chromium  # chromium-common's resources and SwiftShader
DEB=${2:-}
if [[ -z $DEB ]]; then
  (cd /tmp && apt-get download chromium-headless-shell)
  DEB=$(ls -t /tmp/chromium-headless-shell_*.deb | head -1)
fi
rm -rf "$OUT"; mkdir -p "$OUT/x"
dpkg-deb -x "$DEB" "$OUT/x"
C=$OUT/chrome; mkdir -p "$C/lib" "$C/locales" "$C/fonts"
cp -a "$OUT/x/usr/lib/chromium/chromium-headless-shell" "$OUT"/x/usr/lib/chromium/headless_*.pak "$C/"
S=/usr/lib/chromium
cp -a $S/icudtl.dat $S/snapshot_blob.bin $S/v8_context_snapshot.bin \
      $S/libEGL.so $S/libGLESv2.so $S/libvk_swiftshader.so $S/libvulkan.so.1 $S/vk_swiftshader_icd.json "$C/"
cp -a $S/locales/en-US.pak "$C/locales/"
cp /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf "$C/fonts/"
rm -rf "$OUT/x"
# NSS modules loaded with dlopen (softoken, freebl) next to libnss3
for l in libsoftokn3.so libfreeblpriv3.so libfreebl3.so; do cp -L /usr/lib/x86_64-linux-gnu/$l "$C/lib/"; done
# loaded with dlopen by SwiftShader (window-system surfaces); harmless if unused
for l in libwayland-client.so.0 libxcb-shm.so.0; do cp -L /usr/lib/x86_64-linux-gnu/$l "$C/lib/"; done
# every library ldd resolves, except glibc's own
GLIBC='^(libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libresolv\.so\.2|ld-linux-x86-64\.so\.2|linux-vdso\.so\.1)$'
for pass in 1 2; do
  for f in "$C/chromium-headless-shell" "$C"/*.so* "$C"/lib/*.so*; do
    ldd "$f" 2>/dev/null | awk '$2=="=>" && $3 ~ /^\// {print $1, $3}'
  done | sort -u | while read -r name path; do
    [[ $name =~ $GLIBC ]] && continue
    [[ -e $C/$name || -e $C/lib/$name ]] && continue
    cp -L "$path" "$C/lib/$name"
  done
done
strip --strip-unneeded "$C"/lib/*.so* 2>/dev/null || true
cat > "$C/fonts.conf" <<'XML'
<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "urn:fontconfig:fonts.dtd">
<fontconfig>
  <dir prefix="relative">fonts</dir>
  <cachedir>/tmp/chrome_bundle_fontcache</cachedir>
  <match target="pattern"><test qual="any" name="family"><string>sans-serif</string></test><edit name="family" mode="append" binding="weak"><string>DejaVu Sans</string></edit></match>
  <match target="pattern"><test qual="any" name="family"><string>serif</string></test><edit name="family" mode="append" binding="weak"><string>DejaVu Sans</string></edit></match>
  <match target="pattern"><test qual="any" name="family"><string>monospace</string></test><edit name="family" mode="append" binding="weak"><string>DejaVu Sans</string></edit></match>
  <match target="pattern"><edit name="family" mode="append_last" binding="weak"><string>DejaVu Sans</string></edit></match>
</fontconfig>
XML
cat > "$C/run-chromium" <<'SH'
#!/bin/sh
# Portable headless Chromium (Debian 12 chromium-headless-shell 156): bundled libs, font and fontconfig config.
# Pass --no-sandbox when running as root (HeadlessChromium does).
D=$(cd "$(dirname "$0")" && pwd -P)
export LD_LIBRARY_PATH="$D/lib:$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FONTCONFIG_FILE="$D/fonts.conf"
export FONTCONFIG_PATH="$D"
mkdir -p /tmp/chrome_bundle_fontcache 2>/dev/null
# a small /dev/shm (containers: 64 MB) makes renderers crash: use /tmp instead, as Debian's wrapper does
shm=$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $4}')
if [ -z "$shm" ] || [ "$shm" -lt 1048576 ]; then set -- --disable-dev-shm-usage "$@"; fi
exec "$D/chromium-headless-shell" "$@"
SH
chmod 755 "$C/run-chromium"
du -sh "$C"; ls "$C/lib" | wc -l
# pack: tar.xz (x86 BCJ filter + LZMA2 -9e), parts of at most 20 MB, 38 MB, 45 MB, and assemble.sh with their sha256s
[ "${PACK:-1}" = 1 ] || exit 0
HERE=$ROOT/.chrome
mkdir -p "$HERE"
(cd "$OUT" && tar --owner=0 --group=0 --numeric-owner --sort=name -cf - chrome | nice -n 10 xz --x86 --lzma2=preset=9e -T2 > "$OUT/chrome.tar.xz")
python3 "$(dirname "$TEMPLATE")/pack.py" "$OUT/chrome.tar.xz" "$HERE"
ls -l "$OUT/chrome.tar.xz" "$HERE"/part-*
