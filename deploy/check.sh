#!/usr/bin/env bash
# `make deploy-check`: build the image with podman (on a local Debian root as its base when no
# base image can be pulled), validate the compose file with docker-compose and the Kubernetes
# manifests with kubernetes-validate. Needs podman, debootstrap (first run only),
# docker-compose and the venv's kubernetes-validate; .ci/run installs them when it can.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
BASE=${STEPLINE_IMAGE_BASE:-localhost/debian-py:bookworm}
ROOTFS=${STEPLINE_ROOTFS:-/var/tmp/stepline-rootfs}

echo "== compose: docker-compose config"
docker-compose -f deploy/compose.yaml config -q

echo "== kubernetes: kubernetes-validate --strict"
"$BIN/kubernetes-validate" --strict --quiet deploy/kubernetes/stepline.yaml

echo "== image: podman build --isolation chroot (base $BASE)"
if [[ $BASE == localhost/* ]] && ! podman image exists "$BASE"; then
    if [ ! -x "$ROOTFS/usr/bin/python3" ]; then
        debootstrap --variant=minbase --include=python3,python3-venv,python3-pip \
            bookworm "$ROOTFS" >/dev/null
    fi
    tar -C "$ROOTFS" -c . | podman import - "$BASE" >/dev/null
fi
rm -f deploy/wheels/*.whl
"$BIN/python" -m pip wheel -q --disable-pip-version-check --wheel-dir deploy/wheels '.[server]'
podman build -q --isolation chroot --format docker --build-arg "BASE=$BASE" \
    -f deploy/Containerfile -t localhost/stepline:check .
rm -f deploy/wheels/*.whl
podman image inspect localhost/stepline:check --format '{{.Config.User}} {{.Config.Cmd}}' \
    | grep -qx '10001:10001 \[stepline serve\]'
echo "deploy-check: ok"
