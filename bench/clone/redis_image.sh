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

# redis_container NAME IMAGE [PODMAN-RUN-OPTION...] runs IMAGE's redis-server
# as podman container NAME (runc; ulimits within this shell's hard ones,
# which rootful podman's defaults exceed) and prints its address once it
# answers.
redis_container() {
  local name=$1 image=$2 nofile nproc addr
  shift 2
  nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
  [[ $nofile == unlimited || $nofile -gt 1048576 ]] && nofile=1048576
  [[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
  podman --runtime runc run -d --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc" --name "$name" \
    "$@" "$image" /usr/bin/redis-server --save '' --appendonly no --protected-mode no \
    --enable-debug-command yes --dir /data >/dev/null
  addr=$(podman inspect --format '{{.NetworkSettings.IPAddress}}' "$name")
  for _ in $(seq 200); do [[ $(redis-cli -h "$addr" PING 2>/dev/null) == PONG ]] && break; sleep 0.05; done
  echo "$addr"
}
