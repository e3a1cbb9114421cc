#!/usr/bin/env python3
"""Start a local moto EC2 server whose DescribeSpotPriceHistory replays a real spot-price trace.

moto 5.2.5 answers DescribeSpotPriceHistory with one constant price (0.00001) per instance-type
offering, a fixed 2006 timestamp, no time window and no pagination. This launcher replaces that
response handler with one backed by a trace file, so code under test sees real prices:

    python launch.py --trace aws_p3.2xlarge_availability_price_9az_2023-02-15_to_03-09.csv

The first line on stdout is the endpoint (``http://127.0.0.1:PORT``); a caller reads it instead
of sleeping. The server then runs until stdin closes or the process is signalled, so a parent
that dies never leaves it behind. Diagnostics go to stderr.

Trace formats, recognised by content (see operator/ec2/README.md):
  * wide:     ``timestamp_utc,<zone>_available,<zone>_spot_usd_hr,...`` (one instance type,
              given by --instance-type; the shared p3.2xlarge 9-AZ trace)
  * spotlake: ``Time,InstanceType,Region,AZ,...,SpotPrice`` (AZ *IDs*, mapped to moto's zone names)
  * aws-json: the JSON ``aws ec2 describe-spot-price-history`` prints
  * long:     ``timestamp,instance_type,zone,price_usd_hr``

Like EC2, the served history holds one record per price *change* per (instance type, zone);
a query for [StartTime, EndTime] returns the changes inside the window plus the record in force
at StartTime, newest first, paginated by MaxResults/NextToken. Only the trace's zones that belong
to the request's region are served.

Standard library plus moto only.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import logging
import os
import sys
import threading
from dataclasses import dataclass
from datetime import datetime, timezone

PRODUCT_DESCRIPTION = "Linux/UNIX"
# Product descriptions a Linux trace answers to (EC2-Classic era names included).
LINUX_DESCRIPTIONS = {"Linux/UNIX", "Linux/UNIX (Amazon VPC)"}
DEFAULT_MAX_RESULTS = 1000


class TraceError(Exception):
    """A trace file that cannot be read; the message names file and line."""


@dataclass(frozen=True)
class PricePoint:
    """One spot price change."""

    timestamp: datetime
    price: str


def parse_time(text: str, where: str) -> datetime:
    value = text.strip()
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as error:
        raise TraceError(f"{where}: bad timestamp {text!r}: {error}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


def as_utc(value: datetime | str | None, where: str) -> datetime | None:
    """Normalises a request timestamp (moto may hand over a string or a naive datetime)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return parse_time(value, where)
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def parse_price(text: str, where: str) -> str:
    value = text.strip()
    try:
        number = float(value)
    except ValueError:
        raise TraceError(f"{where}: bad price {text!r}") from None
    if not number > 0:
        raise TraceError(f"{where}: price must be positive, got {text!r}")
    return value


def zone_id_map() -> dict[str, str]:
    """Maps AZ IDs (use1-az4) to moto's zone names (us-east-1d)."""
    from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend

    return {
        zone.zone_id: zone.name
        for zones in RegionsAndZonesBackend.zones.values()
        for zone in zones
    }


def load_trace(path: str, instance_type: str) -> dict[tuple[str, str], list[PricePoint]]:
    """Reads a trace into sorted price-change lists keyed by (instance type, zone)."""
    raw: dict[tuple[str, str], list[tuple[datetime, str]]] = {}

    def add(itype: str, zone: str, when: datetime, price: str) -> None:
        raw.setdefault((itype, zone), []).append((when, price))

    with open(path, newline="", encoding="utf-8") as handle:
        head = handle.read(1)
        handle.seek(0)
        if head == "{":
            document = json.load(handle)
            for index, item in enumerate(document.get("SpotPriceHistory", [])):
                where = f"{path}: SpotPriceHistory[{index}]"
                add(
                    item["InstanceType"],
                    item["AvailabilityZone"],
                    parse_time(item["Timestamp"], where),
                    parse_price(item["SpotPrice"], where),
                )
        else:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            if "timestamp_utc" in header:
                zones = [c[: -len("_spot_usd_hr")] for c in header if c.endswith("_spot_usd_hr")]
                if not zones:
                    raise TraceError(f"{path}: line 1: no <zone>_spot_usd_hr columns")
                for row in reader:
                    where = f"{path}: line {reader.line_num}"
                    when = parse_time(row["timestamp_utc"], where)
                    for zone in zones:
                        add(instance_type, zone, when, parse_price(row[f"{zone}_spot_usd_hr"], f"{where}: column {zone}_spot_usd_hr"))
            elif {"Time", "InstanceType", "AZ", "SpotPrice"} <= set(header):
                names = zone_id_map()
                gaps = 0
                unmapped: set[str] = set()
                for row in reader:
                    where = f"{path}: line {reader.line_num}"
                    zone = names.get(row["AZ"])
                    if zone is None:
                        # moto does not model every AZ ID; those rows cannot be served.
                        unmapped.add(row["AZ"])
                        continue
                    try:
                        missing = float(row["SpotPrice"]) <= 0
                    except ValueError:
                        missing = False  # parse_price below reports it
                    if missing:
                        # SpotLake writes -1 where it has no price: a gap, not a free instance.
                        gaps += 1
                        continue
                    add(row["InstanceType"], zone, parse_time(row["Time"], where), parse_price(row["SpotPrice"], f"{where}: column SpotPrice"))
                if gaps:
                    print(f"launch.py: {path}: skipped {gaps} rows without a price (SpotPrice <= 0)", file=sys.stderr)
                if unmapped:
                    print(f"launch.py: {path}: skipped AZ IDs moto does not know: {sorted(unmapped)}", file=sys.stderr)
            elif {"timestamp", "instance_type", "zone", "price_usd_hr"} <= set(header):
                for row in reader:
                    where = f"{path}: line {reader.line_num}"
                    add(row["instance_type"], row["zone"], parse_time(row["timestamp"], where), parse_price(row["price_usd_hr"], f"{where}: column price_usd_hr"))
            else:
                raise TraceError(f"{path}: line 1: unrecognised trace header {header!r}")

    history: dict[tuple[str, str], list[PricePoint]] = {}
    for key, points in raw.items():
        points.sort(key=lambda point: point[0])
        changes: list[PricePoint] = []
        for when, price in points:
            if changes and float(changes[-1].price) == float(price):
                continue
            changes.append(PricePoint(when, price))
        history[key] = changes
    return history


def region_of(zone: str) -> str:
    return zone.rstrip("abcdefghijklmnopqrstuvwxyz")


class TraceHistory:
    """Answers DescribeSpotPriceHistory queries from a loaded trace."""

    def __init__(self, history: dict[tuple[str, str], list[PricePoint]]):
        self.history = history
        self.times = {key: [p.timestamp for p in points] for key, points in history.items()}

    def query(
        self,
        region: str,
        instance_types: list[str],
        zones: list[str],
        product_descriptions: list[str],
        start: datetime | None,
        end: datetime | None,
    ) -> list[dict]:
        if product_descriptions and not (set(product_descriptions) & LINUX_DESCRIPTIONS):
            return []
        records = []
        for (itype, zone), points in self.history.items():
            if region_of(zone) != region:
                continue
            if instance_types and itype not in instance_types:
                continue
            if zones and zone not in zones:
                continue
            times = self.times[(itype, zone)]
            # EC2 returns the record in force at StartTime, then every change up to EndTime.
            first = 0 if start is None else max(bisect.bisect_right(times, start) - 1, 0)
            last = len(times) if end is None else bisect.bisect_right(times, end)
            for point in points[first:last]:
                records.append(
                    {
                        "InstanceType": itype,
                        "ProductDescription": PRODUCT_DESCRIPTION,
                        "SpotPrice": point.price,
                        "AvailabilityZone": zone,
                        "Timestamp": point.timestamp,
                    }
                )
        records.sort(key=lambda r: (-r["Timestamp"].timestamp(), r["AvailabilityZone"], r["InstanceType"]))
        return records


def install(trace: TraceHistory) -> None:
    """Replaces moto's DescribeSpotPriceHistory handler with one backed by the trace."""
    from moto.core.responses import ActionResult
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.responses.spot_instances import SpotInstances

    def describe_spot_price_history(self):  # noqa: ANN001 - moto's handler signature
        filters = self._filters_from_querystring()
        instance_types = list(self._get_param("InstanceTypes", []) or []) + list(filters.get("instance-type", []))
        zones = list(filters.get("availability-zone", []))
        single_zone = self._get_param("AvailabilityZone")
        if single_zone:
            zones.append(single_zone)
        descriptions = list(self._get_param("ProductDescriptions", []) or []) + list(filters.get("product-description", []))
        start = self._get_param("StartTime")
        end = self._get_param("EndTime")
        start = as_utc(start, "StartTime")
        end = as_utc(end, "EndTime")
        if start is not None and end is not None and start > end:
            raise EC2ClientError("InvalidParameterValue", "StartTime must be before EndTime")
        max_results = self._get_param("MaxResults") or DEFAULT_MAX_RESULTS
        max_results = int(max_results)
        if not 5 <= max_results <= 1000:
            raise EC2ClientError("InvalidParameterValue", f"MaxResults must be between 5 and 1000, got {max_results}")
        token = self._get_param("NextToken")
        offset = 0
        if token:
            if not token.startswith("offset-") or not token[len("offset-"):].isdigit():
                raise EC2ClientError("InvalidNextToken", "The specified NextToken is not valid")
            offset = int(token[len("offset-"):])
        records = trace.query(self.region, instance_types, zones, descriptions, start, end)
        page = records[offset : offset + max_results]
        result = {"SpotPriceHistory": page}
        if offset + max_results < len(records):
            result["NextToken"] = f"offset-{offset + max_results}"
        return ActionResult(result)

    SpotInstances.describe_spot_price_history = describe_spot_price_history


def load_specs(path: str) -> dict[str, tuple[int, int]]:
    """Reads ``instance_type,vcpus,memory_gib`` rows into {type: (vcpus, memory MiB)}."""
    specs = {}
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        for row in reader:
            where = f"{path}: line {reader.line_num}"
            try:
                specs[row["instance_type"]] = (int(row["vcpus"]), round(float(row["memory_gib"]) * 1024))
            except (KeyError, ValueError) as error:
                raise TraceError(f"{where}: bad instance spec row: {error}") from None
    return specs


def install_instance_types(pools: list[tuple[str, str]], specs_path: str | None) -> None:
    """Makes moto know every instance type of the trace and offer it in the trace's zones.

    moto 5.2.5's catalogue lacks some types real traces use (p3.2xlarge among them). A missing
    type is synthesised from a family member (or m5.large) with vCPUs and memory from the
    specs file; GPU count, when the family has GPUs, is scaled by vCPUs (at least 1).
    """
    import copy

    from moto.ec2.models.instance_types import (
        INSTANCE_TYPE_OFFERINGS,
        INSTANCE_TYPES,
        InstanceType,
        InstanceTypeBackend,
    )

    specs = load_specs(specs_path) if specs_path else {}
    for itype in sorted({itype for itype, _ in pools}):
        if itype in INSTANCE_TYPES:
            continue
        if itype not in specs:
            raise TraceError(f"instance type {itype} is unknown to moto and missing from the specs file {specs_path}")
        vcpus, memory_mib = specs[itype]
        family = itype.split(".")[0]
        siblings = sorted(name for name in INSTANCE_TYPES if name.split(".")[0].startswith(family))
        template = INSTANCE_TYPES[siblings[0] if siblings else "m5.large"]
        entry = copy.deepcopy(template)
        entry["InstanceType"] = itype
        template_vcpus = template["VCpuInfo"]["DefaultVCpus"]
        entry["VCpuInfo"] = {"DefaultVCpus": vcpus, "DefaultCores": max(vcpus // 2, 1), "DefaultThreadsPerCore": 2 if vcpus > 1 else 1}
        entry["MemoryInfo"] = {"SizeInMiB": memory_mib}
        entry["SupportedUsageClasses"] = ["on-demand", "spot"]
        for gpu in entry.get("GpuInfo", {}).get("Gpus", []):
            gpu["Count"] = max(round(gpu["Count"] * vcpus / template_vcpus), 1)
        if "GpuInfo" in entry:
            gpus = entry["GpuInfo"]["Gpus"]
            entry["GpuInfo"]["TotalGpuMemoryInMiB"] = sum(g["Count"] * g["MemoryInfo"]["SizeInMiB"] for g in gpus)
        INSTANCE_TYPES[itype] = entry
        InstanceTypeBackend.instance_types.append(InstanceType(itype))
        print(f"launch.py: added instance type {itype} ({vcpus} vCPUs, {memory_mib} MiB) from {siblings[:1] or ['m5.large']}", file=sys.stderr)

    for itype, zone in pools:
        region = region_of(zone)
        for location_type, location in (("availability-zone", zone), ("region", region)):
            offers = INSTANCE_TYPE_OFFERINGS.setdefault(location_type, {}).setdefault(region, [])
            if not any(o["InstanceType"] == itype and o["Location"] == location for o in offers):
                offers.append({"InstanceType": itype, "Location": location, "LocationType": location_type})


def install_full_launches() -> None:
    """Makes RunInstances launch MaxCount instances, as EC2 does when capacity suffices.

    moto 5.2.5 launches MinCount; ebbflow asks for 1..=N so a short pool still yields some.
    """
    from moto.ec2.responses.instances import InstanceResponse

    original = InstanceResponse.run_instances

    def run_instances(self):  # noqa: ANN001 - moto's signature
        max_count = self._get_param("MaxCount")
        if max_count is None:
            return original(self)
        get_param = self._get_param
        self._get_param = lambda name, if_none=None: max_count if name == "MinCount" else get_param(name, if_none)
        try:
            return original(self)
        finally:
            del self._get_param

    InstanceResponse.run_instances = run_instances


def install_unsupported_errors() -> None:
    """Answers actions moto lacks with EC2's UnsupportedOperation error instead of an HTML 500.

    A 500 would look like a transient server fault to a client and be retried; real EC2 answers
    an operation a region does not offer with a 400 ``UnsupportedOperation``.
    """
    from moto.core.responses import ActionResult
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.responses import EC2Response

    original = EC2Response.call_action

    def call_action(self):  # noqa: ANN001 - moto's signature
        try:
            return original(self)
        except NotImplementedError as error:
            unsupported = EC2ClientError("UnsupportedOperation", f"moto: {error}")
            status, headers, body = self.serialized(ActionResult(unsupported))
            headers, body = self._enrich_response(headers, body)
            return status, headers, body

    EC2Response.call_action = call_action


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", help="spot price trace to serve (default: moto's constant prices)")
    parser.add_argument("--instance-type", default="p3.2xlarge", help="instance type of a wide (single-type) trace")
    parser.add_argument(
        "--specs",
        help="instance_type,vcpus,memory_gib CSV for trace types moto lacks "
        "(default: aws_instance_specs.csv beside the trace, if present)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args()

    # Read by moto at import: reject unknown instance types like EC2 does.
    os.environ.setdefault("MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION", "true")
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer

    # One log line per request would flood a parent that does not drain our stderr.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)

    install_unsupported_errors()
    install_full_launches()
    if args.trace:
        specs = args.specs
        if specs is None:
            beside = os.path.join(os.path.dirname(os.path.abspath(args.trace)), "aws_instance_specs.csv")
            specs = beside if os.path.exists(beside) else None
        try:
            history = load_trace(args.trace, args.instance_type)
            install_instance_types(sorted(history), specs)
        except (OSError, TraceError, KeyError, json.JSONDecodeError) as error:
            print(f"launch.py: cannot load trace: {error}", file=sys.stderr)
            return 2
        install(TraceHistory(history))
        points = sum(len(p) for p in history.values())
        print(f"launch.py: serving {points} price changes for {len(history)} pools from {args.trace}", file=sys.stderr)

    server = ThreadedMotoServer(ip_address=args.host, port=args.port, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    print(f"http://{host}:{port}", flush=True)

    # Stay up until the parent closes our stdin (or kills us).
    done = threading.Event()

    def wait_stdin() -> None:
        try:
            while sys.stdin.read(4096):
                pass
        finally:
            done.set()

    threading.Thread(target=wait_stdin, daemon=True).start()
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
