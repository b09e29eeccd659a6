"""`spyre-operator`: run the operator, or print the CRD."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import sys
from datetime import UTC, datetime
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: LogRecord attributes that are not extra fields (``logging.makeLogRecord`` sets them all).
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
#: Extra fields kopf's per-object loggers add: the object's reference is kept (as ``object``),
#: the rest is kopf's internals.
_KOPF_EXTRAS = frozenset({"k8s_ref", "k8s_skip", "settings"})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (RFC 3339, UTC), level, logger, message; ``object``
    (apiVersion, kind, namespace, name, uid) on kopf's per-object lines; ``exception`` with
    the traceback if there is one; and any other ``extra=`` fields a caller passed."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, dict):
            out["object"] = {k: v for k, v in ref.items() if v is not None}
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and key not in _KOPF_EXTRAS and key not in out:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)


def configure_logging(level: str, log_format: str = "text") -> None:
    """The root logger's level and format: ``text`` (as before) or ``json``."""
    handler = logging.StreamHandler()
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])


def _json_flag(flag: str, text: str | None, schema: Any) -> Any:
    """A JSON-valued flag, validated against ``schema`` (a pydantic type)."""
    from pydantic import TypeAdapter, ValidationError

    if not text:
        return None
    try:
        return TypeAdapter(schema).validate_json(text)
    except ValidationError as e:
        raise ValueError(f"{flag}: {e.errors()[0]['msg']} in {text!r}") from None


def site_defaults(args: argparse.Namespace, scc_probe: Any = None) -> Any:
    """The cluster-wide defaults (desired.site.SiteDefaults) from the ``--default-*``,
    ``--allowed-engine-image`` and ``--pod-user`` flags; ValueError names a flag whose value
    cannot work. ``scc_probe`` answers ``--pod-user auto`` (default: ask the API server)."""
    import re

    from .api.v1alpha1 import (
        DNS_SUBDOMAIN_PATTERN,
        EXTENDED_RESOURCE_PATTERN,
        NodeSelector,
        Toleration,
    )
    from .desired.site import SiteDefaults
    from .kube.podsecurity import platform_assigns_user, scc_api_served

    if args.default_card_resource is not None and not re.match(
        EXTENDED_RESOURCE_PATTERN, args.default_card_resource
    ):
        raise ValueError(
            f"--default-card-resource {args.default_card_resource!r}: not an extended "
            "resource name, e.g. ibm.com/spyre_vf"
        )
    if args.default_device_class and not re.match(
        DNS_SUBDOMAIN_PATTERN, args.default_device_class
    ):
        raise ValueError(
            f"--default-device-class {args.default_device_class!r}: not a DeviceClass name, "
            "e.g. spyre-standard-vf"
        )
    given = {
        "engine_image": args.default_engine_image,
        "image_pull_secrets": tuple(dict.fromkeys(args.default_image_pull_secret)),
        "service_account_name": args.default_service_account,
        "resource_name": args.default_card_resource,
        "device_class_name": args.default_device_class,
        "scheduler_name": args.default_scheduler_name,
        "serving_node_selector": _json_flag(
            "--default-serving-node-selector", args.default_serving_node_selector, NodeSelector
        ),
        "serving_tolerations": _json_flag(
            "--default-serving-tolerations", args.default_serving_tolerations, list[Toleration]
        ),
        "precompile_node_selector": _json_flag(
            "--default-precompile-node-selector",
            args.default_precompile_node_selector,
            NodeSelector,
        ),
        "precompile_tolerations": _json_flag(
            "--default-precompile-tolerations",
            args.default_precompile_tolerations,
            list[Toleration],
        ),
        "storage_class_name": args.default_storage_class,
        "precompile_max_load_processes": args.default_precompile_max_load_processes,
        "allowed_engine_images": tuple(dict.fromkeys(args.allowed_engine_image)),
        "platform_assigns_user": platform_assigns_user(args.pod_user, scc_probe or scc_api_served),
    }
    # --required-scc auto: restricted-v2 where the platform assigns the user (OpenShift; the
    # SCC that admits exactly what these pods ask for), none elsewhere.
    given["required_scc"] = (
        ("restricted-v2" if given["platform_assigns_user"] else "")
        if args.required_scc == "auto" else args.required_scc
    )
    given["selinux_change_policy"] = args.selinux_change_policy
    for k in ("serving_tolerations", "precompile_tolerations"):
        if given[k] is not None:
            given[k] = tuple(given[k])
    site = SiteDefaults(**{k: v for k, v in given.items() if v is not None})
    if not site.allows(site.engine_image):
        raise ValueError(
            f"the default engine image {site.engine_image} is not allowed by "
            f"--allowed-engine-image {' '.join(site.allowed_engine_images)}: every model "
            "leaving engine.image unset would be refused"
        )
    return site


def _run(args: argparse.Namespace) -> int:
    import kopf

    from . import handlers  # noqa: F401 - registers the kopf handlers
    from .handlers import OperatorConfig

    if not args.all_namespaces and not args.namespace:
        print(
            "spyre-operator run: pass --namespace NS (repeatable) or --all-namespaces",
            file=sys.stderr,
        )
        return 2
    try:
        OperatorConfig.site = site_defaults(args)
    except ValueError as e:
        print(f"spyre-operator run: {e}", file=sys.stderr)
        return 2
    OperatorConfig.workers = args.workers
    OperatorConfig.namespaces = [] if args.all_namespaces else list(dict.fromkeys(args.namespace))
    OperatorConfig.metrics_port = args.metrics_port
    OperatorConfig.metrics_auth = args.metrics_auth
    OperatorConfig.metrics_tls_dir = args.metrics_tls_dir
    OperatorConfig.max_concurrent_compiles = args.max_concurrent_compiles
    OperatorConfig.max_concurrent_rollouts = args.max_concurrent_rollouts
    OperatorConfig.compiles_per_namespace = args.max_concurrent_compiles_per_namespace
    OperatorConfig.rollouts_per_namespace = args.max_concurrent_rollouts_per_namespace
    OperatorConfig.leader_election = args.leader_elect
    # The Lease lives in the operator's own namespace (POD_NAMESPACE, set by the chart); run
    # outside a pod, in the first watched namespace, or in `default` with --all-namespaces.
    # Operators with the same scope share it and never write at once; operators watching
    # other namespaces (another team's install) do not block each other.
    OperatorConfig.leader_election_namespace = args.leader_election_namespace or (
        os.environ.get("POD_NAMESPACE") or (args.namespace[0] if args.namespace else "default")
    )
    OperatorConfig.leader_election_lease = args.leader_election_lease
    try:
        OperatorConfig.scale_to_zero = scale_to_zero_config(args)
    except ValueError as e:
        print(f"spyre-operator run: {e}", file=sys.stderr)
        return 2
    if OperatorConfig.scale_to_zero.enabled:
        handlers.register_mirror_slice_handlers()
    OperatorConfig.coldstart_port = args.coldstart_port
    OperatorConfig.identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    configure_logging(args.log_level, args.log_format)
    # kopf's per-object log lines are noisy at 500 models; ours are enough.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # One line per API request (the Lease every 2 s) would drown the operator's own lines.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    asyncio.run(
        kopf.operator(
            clusterwide=args.all_namespaces,
            namespaces=list(args.namespace),
            standalone=True,
            liveness_endpoint=args.liveness,
            # kopf would otherwise detect its identity with getpass.getuser(), which raises
            # in a container whose uid has no passwd entry (the chart runs as 65532).
            identity=OperatorConfig.identity,  # type: ignore[arg-type]
        )
    )
    return 0


def _service_ref(value: str, flag: str, with_port: bool) -> tuple[str, str, int]:
    """``namespace/name`` or ``namespace/name:port`` -> (namespace, name, port or 0)."""
    ref, port = value, 0
    if with_port:
        ref, sep, port_text = value.rpartition(":")
        if not sep or not port_text.isdigit():
            raise ValueError(f"{flag} {value!r}: expected namespace/name:port")
        port = int(port_text)
    ns, sep, name = ref.partition("/")
    if not sep or not ns or not name:
        raise ValueError(f"{flag} {value!r}: expected namespace/name")
    return ns, name, port


def scale_to_zero_config(args: argparse.Namespace) -> Any:
    """The scale-to-zero settings (reconcile.ScaleToZeroConfig) from the flags."""
    from .decide import ScaleToZeroConfig

    ins_ns, ins_name, _ = _service_ref(
        args.keda_interceptor_service, "--keda-interceptor-service", False
    )
    cold = ("", "", 0)
    if args.coldstart_service:
        cold = _service_ref(args.coldstart_service, "--coldstart-service", True)
    return ScaleToZeroConfig(
        enabled=args.scale_to_zero,
        scaler_address=args.keda_scaler_address,
        interceptor_namespace=ins_ns,
        interceptor_service=ins_name,
        interceptor_port_name=args.keda_interceptor_port_name,
        prometheus_address=args.prometheus_address,
        coldstart_namespace=cold[0],
        coldstart_service=cold[1],
        coldstart_port=cold[2],
    )


def _add_site_flags(run: argparse.ArgumentParser) -> None:
    """Cluster-wide defaults of the per-site SpyreModel fields (a model that leaves one unset
    follows it at every reconcile) and the engine-image allow-list."""
    from .desired.pod import SELINUX_CHANGE_POLICIES
    from .desired.site import BUILTIN_ENGINE_IMAGE
    from .kube.podsecurity import POD_USER_CHOICES

    g = run.add_argument_group(
        "cluster-wide defaults",
        "for SpyreModel fields left unset, followed at every reconcile (status.effective "
        "shows the values in use)",
    )
    g.add_argument(
        "--default-engine-image",
        default=None,
        metavar="IMAGE",
        help=f"engine.image (built in: {BUILTIN_ENGINE_IMAGE}); "
        "part of the artifact key: a new default compiles every following model anew",
    )
    g.add_argument(
        "--default-image-pull-secret",
        action="append",
        default=[],
        metavar="NAME",
        help="engine.imagePullSecrets (repeatable; a Secret in each model's namespace)",
    )
    g.add_argument(
        "--default-service-account",
        default=None,
        metavar="NAME",
        help="engine.serviceAccountName: the ServiceAccount of precompile and serving pods, "
        "in each model's namespace (built in: none, the namespace's default)",
    )
    g.add_argument(
        "--default-card-resource",
        default=None,
        metavar="RESOURCE",
        help="accelerator.resourceName (built in: ibm.com/spyre_vf)",
    )
    g.add_argument(
        "--default-device-class",
        default=None,
        metavar="NAME",
        help="accelerator.deviceClassName of models that name neither a card resource nor a "
        "DeviceClass: their cards are claimed through DRA (e.g. spyre-standard-vf; built in: "
        "none, the card resource)",
    )
    g.add_argument(
        "--default-scheduler-name",
        default=None,
        metavar="NAME",
        help="accelerator.schedulerName of pods on the cards (built in: spyre-scheduler; "
        "empty: the cluster's default scheduler)",
    )
    g.add_argument(
        "--default-serving-node-selector",
        default=None,
        metavar="JSON",
        help='accelerator.nodeSelector, a JSON object, e.g. {"pool": "spyre"}',
    )
    g.add_argument(
        "--default-serving-tolerations", default=None, metavar="JSON",
        help="accelerator.tolerations, a JSON list of tolerations",
    )
    g.add_argument(
        "--default-precompile-node-selector", default=None, metavar="JSON",
        help="precompile.nodeSelector (compiling off the cards), a JSON object",
    )
    g.add_argument(
        "--default-precompile-tolerations", default=None, metavar="JSON",
        help="precompile.tolerations, a JSON list of tolerations",
    )
    g.add_argument(
        "--default-precompile-max-load-processes",
        type=_budget,
        default=None,
        metavar="N",
        help="precompile.maxLoadProcesses: how many tensor-parallel workers of a precompile "
        "pod load and compile the model at once (SENDNN_INFERENCE_MAX_LOAD_PROCESSES; fewer "
        "use less of the CPU pool's memory; 0: all; built in: the plugin's default, all). Not "
        "part of the artifact key",
    )
    g.add_argument(
        "--default-storage-class",
        default=None,
        metavar="CLASS",
        help="cache.volume.storageClassName of cache PVCs the operator creates (built in: "
        "none, the cluster's default StorageClass); an existing PVC keeps its class",
    )
    g.add_argument(
        "--allowed-engine-image",
        action="append",
        default=[],
        metavar="PATTERN",
        help="an engine image models may run, a shell pattern such as "
        "registry.example.com/spyre/* (repeatable; none given: any image). A model whose "
        "image matches none is refused (EngineImageNotAllowed) and nothing is compiled",
    )
    g.add_argument(
        "--required-scc",
        default="auto",
        metavar="NAME",
        help="the SCC every precompile, serving and GC pod pins (the annotation "
        "openshift.io/required-scc, OpenShift 4.14+): without it a pod gets the highest-"
        "priority SCC its ServiceAccount may use (anyuid on many clusters: no fsGroup, a cache "
        "it cannot write). 'auto' (default): restricted-v2 where the platform assigns the "
        "user (--pod-user), none elsewhere; '' pins none",
    )
    g.add_argument(
        "--selinux-change-policy",
        choices=SELINUX_CHANGE_POLICIES,
        default="",
        help="seLinuxChangePolicy of every precompile, serving and GC pod (Kubernetes 1.32+; "
        "they share the cache claim, so one value for all): 'MountOption' mounts an eligible "
        "volume (a CSI driver with seLinuxMount) with the pod's label instead of relabelling "
        "every file of the cache at each start; 'Recursive' relabels every file (needed where "
        "privileged and unprivileged pods share the volume); '' (default) sets none: the "
        "cluster's default (MountOption where the SELinuxMount features are on)",
    )
    g.add_argument(
        "--pod-user",
        choices=POD_USER_CHOICES,
        default="auto",
        help="the uid of the precompile, serving and GC pods: 'assigned' sets no runAsUser, "
        "runAsGroup or fsGroup and lets the platform assign them (OpenShift's restricted-v2 "
        "SCC); 'fixed' pins the engine image's uid 1001 and fsGroup 1001 (plain Kubernetes); "
        "'auto' (default) is 'assigned' when the API server serves security.openshift.io/v1",
    )


def _budget(value: str) -> int:
    """A budget: a whole number, 0 for no limit."""
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (no limit) or more, not {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    """The command line of `spyre-operator`."""
    from .runtime.metrics_auth import MODES as METRICS_AUTH_MODES

    parser = argparse.ArgumentParser(prog="spyre-operator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("crd", help="print the SpyreModel CRD generated from the API models")
    sub.add_parser("api-doc", help="print docs/api.md, the field reference generated from the CRD")
    reasons = sub.add_parser("reasons-doc", help="write the reasons table of "
                             "docs/troubleshooting.md (generated from gen/reason_docs.py) "
                             "into PAGE")
    reasons.add_argument("page", help="the page to update in place (docs/troubleshooting.md)")
    run = sub.add_parser("run", help="run the operator")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", "-n", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    run.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("SPYRE_WORKERS", "32")),
        help="concurrent reconciles (they mostly wait on the API server; default 32)",
    )
    run.add_argument("--metrics-port", type=int, default=None, help="serve /metrics here")
    run.add_argument(
        "--metrics-auth",
        choices=METRICS_AUTH_MODES,
        default="none",
        help="who may read /metrics: anyone (none, the default outside the chart), or a bearer "
        "token whose user RBAC lets get the non-resource URL /metrics (kubernetes: a "
        "TokenReview and a SubjectAccessReview, cached a minute; the chart's default)",
    )
    run.add_argument(
        "--metrics-tls-dir",
        default=None,
        help="serve /metrics over HTTPS with this directory's tls.crt and tls.key (a mounted "
        "kubernetes.io/tls Secret; a renewed certificate is loaded within a minute)",
    )
    run.add_argument(
        "--max-concurrent-compiles",
        type=_budget,
        default=_budget(os.environ.get("SPYRE_MAX_CONCURRENT_COMPILES", "4")),
        help="precompile Jobs running at once across the watched namespaces; a model that "
        "needs one more waits (WaitingForCompileSlot), oldest first (default 4; 0: no limit)",
    )
    run.add_argument(
        "--max-concurrent-rollouts",
        type=_budget,
        default=_budget(os.environ.get("SPYRE_MAX_CONCURRENT_ROLLOUTS", "4")),
        help="serving Deployments rolling at once; a model whose new artifact is ready keeps "
        "serving the previous one until a slot frees (WaitingForRolloutSlot; default 4; 0: no "
        "limit)",
    )
    run.add_argument(
        "--max-concurrent-compiles-per-namespace",
        type=_budget,
        default=_budget(os.environ.get("SPYRE_MAX_CONCURRENT_COMPILES_PER_NAMESPACE", "0")),
        help="the most precompile slots one namespace may hold (default 0: no cap). Either "
        "way a freed slot goes to the namespace holding the fewest, oldest waiting first",
    )
    run.add_argument(
        "--max-concurrent-rollouts-per-namespace",
        type=_budget,
        default=_budget(os.environ.get("SPYRE_MAX_CONCURRENT_ROLLOUTS_PER_NAMESPACE", "0")),
        help="the most rollout slots one namespace may hold (default 0: no cap)",
    )
    run.add_argument(
        "--liveness", default=None, help="kopf health endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    run.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=(
            "only the holder of a Lease writes (default: on, so two operators watching the "
            "same namespaces never both write; --no-leader-elect for a single, sole operator)"
        ),
    )
    run.add_argument("--leader-election-namespace", default=None)
    run.add_argument(
        "--leader-election-lease",
        default=os.environ.get("SPYRE_LEADER_ELECTION_LEASE", "spyre-model-operator"),
        help=(
            "name of the Lease, one per install (the chart passes the release's full name): "
            "two installs in one namespace must not share it. The Lease (namespace/name) also "
            "identifies this install in status.operator, where another install that writes the "
            "same SpyreModels is noticed"
        ),
    )
    s2z = run.add_argument_group("scale to zero (autoscaling.minReplicas 0: KEDA + HTTP add-on)")
    s2z.add_argument(
        "--no-scale-to-zero",
        dest="scale_to_zero",
        action="store_false",
        help="no KEDA watches (the chart's scaleToZero.enabled=false): models asking for "
        "minReplicas 0 report ScaleToZeroUnavailable",
    )
    s2z.add_argument(
        "--keda-scaler-address",
        default="keda-add-ons-http-external-scaler.keda:9090",
        help="the HTTP add-on's external scaler (host:port), for the ScaledObjects' "
        "external-push trigger",
    )
    s2z.add_argument(
        "--keda-interceptor-service",
        default="keda/keda-add-ons-http-interceptor-proxy",
        help="namespace/name of the interceptor proxy Service: its EndpointSlices are mirrored "
        "into each scale-to-zero model's Service",
    )
    s2z.add_argument(
        "--keda-interceptor-port-name",
        default="",
        help="the interceptor EndpointSlice port to mirror (default: its only/first port)",
    )
    s2z.add_argument(
        "--prometheus-address",
        default="",
        help="Prometheus scraping the engine pods (http://host:port), for the ScaledObjects' "
        "prometheus triggers; empty: only models without autoscaling targets may scale to zero",
    )
    s2z.add_argument(
        "--coldstart-service",
        default="",
        help="namespace/name:port of the Service in front of the cold-start responder "
        "(--coldstart-port); empty: no failover (past the wait bound the interceptor answers 502)",
    )
    s2z.add_argument(
        "--coldstart-port",
        type=int,
        default=None,
        help="serve the cold-start responder (503 + Retry-After for requests held too long) here",
    )
    run.add_argument("--log-level", default="info")
    run.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text (default) or json: one object per line with time, level, logger, message "
        "and, on kopf's per-object lines, the object",
    )
    _add_site_flags(run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `spyre-operator` console script."""
    args = build_parser().parse_args(argv)
    if args.command == "crd":
        from .gen.crd import render_crd

        sys.stdout.write(render_crd())
        return 0
    if args.command == "api-doc":
        from .gen.apidoc import render_api_doc

        sys.stdout.write(render_api_doc())
        return 0
    if args.command == "reasons-doc":
        from pathlib import Path

        from .gen.reason_docs import splice

        page = Path(args.page)
        page.write_text(splice(page.read_text()))
        return 0
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
