# Sourced by the bench/clone scripts: redis_image IMAGE WORKDIR imports a
# podman image of this host's redis-server and the libraries it loads (no
# registry here), unless IMAGE exists.
redis_image() {
  local image=$1 rootfs=$2/rootfs
  podman image exists "$image" && return 0
  mkdir -p "$rootfs/usr/bin" "$rootfs/tmp" "$rootfs/data"
  cp /usr/bin/redis-server "$rootfs/usr/bin/"
  for lib in $(ldd /usr/bin/redis-server | grep -o '/[^ ]*'); do
    mkdir -p "$rootfs$(dirname "$lib")"; cp -L "$lib" "$rootfs$lib"
  done
  tar -C "$rootfs" -cf "$2/rootfs.tar" . && podman import "$2/rootfs.tar" "$image" >/dev/null
  rm -rf "$rootfs" "$2/rootfs.tar"
}
