"""
``multigeom-workflow``: commands beside Snakemake that start no job.

    multigeom-workflow progress          per configuration, per-image files done / total
                                         (what Snakemake's plan leaves; noise ceiling)
    multigeom-workflow clear             delete chosen per-image files (nothing else)
    multigeom-workflow verify            list bad per-image files (--set-aside them)
    (both with --modal-volume NAME: the files on the Modal executor's volume as well)
    multigeom-workflow install-profiles  make `snakemake --profile local-gpu` work
    multigeom-workflow modal-check       a first contact with a Modal account (cents)

They read the workflow's configuration as Snakemake does (``config/config.yaml``,
deep-merged with the files given with ``--configfile``, then ``--config KEY=VALUE``,
by Snakemake's own functions; validated by the same schema) and run in the working
directory of the runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .compute.kept import drop_kept
from .on_modal import check as modal_check
from .on_modal.volume import (
    default_prefix,
    volume_files,
    volume_progress,
    volume_remove,
)
from .results.verify import bad_per_image_files, run_files, set_aside
from .scenario import ConfigError, Scenario, validated_scenario
from .settings.files import CHECKOUT_DIR
from .settings.layout import is_ceiling_file, parse_image_file
from .settings.load import load_config
from .settings.names import CEILING_ROW, configuration_label

__all__ = ["install_profiles", "load_config", "locked", "main"]


def locked(directory: Path = Path(".")) -> list[Path]:
    """The lock files a running Snakemake holds in ``<directory>/.snakemake/locks``."""
    locks = directory / ".snakemake" / "locks"
    return sorted(p for p in locks.iterdir() if p.is_file()) if locks.is_dir() else []


def _selected(scenario: Scenario, names: list[str] | None):
    known = {configuration_label(c.encoder, c.area): c for c in scenario.configurations}
    if not names:
        return list(known.values())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(
            f"--configs {unknown[0]!r}: not a configuration of this run; allowed: "
            f"{', '.join(known)}"
        )
    return [known[n] for n in names]


#: The profile Snakemake reads at every run of the workflow (``profiles/default``
#: beside the Snakefile, its "workflow specific profile"), not one to register.
WORKFLOW_PROFILE = "default"


def install_profiles(profiles_dir: Path, target: Path | None = None) -> list[Path]:
    """
    Register the workflow's profiles where Snakemake looks up a bare profile name (its
    user configuration folder, ``~/.config/snakemake`` on Linux): one symbolic link per
    folder of `profiles_dir`, so that ``snakemake --profile local-gpu`` works from any
    folder. A link that is already there is kept. ``profiles/default`` is left out:
    it is the workflow's own profile, which Snakemake reads next to the Snakefile at
    every run (`WORKFLOW_PROFILE`), and a user's ``default`` profile is theirs.

    Raises
    ------
    ConfigError
        If another profile of the same name is already registered.
    """
    if target is None:
        from platformdirs import user_config_dir

        target = Path(user_config_dir("snakemake", "snakemake"))
    target.mkdir(parents=True, exist_ok=True)
    links = []
    for profile in sorted(
        p for p in profiles_dir.iterdir() if p.is_dir() and p.name != WORKFLOW_PROFILE
    ):
        link = target / profile.name
        if link.is_symlink() and link.resolve() == profile.resolve():
            links.append(link)
            continue
        if link.exists() or link.is_symlink():
            raise ConfigError(
                f"profile {profile.name!r}: {link} already exists and is not this "
                f"workflow's; remove it or use --profile {profile}"
            )
        link.symlink_to(profile.resolve(), target_is_directory=True)
        links.append(link)
    return links


def planned_progress(args) -> tuple[dict, dict, set]:
    """
    Per configuration (encoder, area): (per-image files not to be computed, n_images)
    and the same for the noise ceiling's second estimates, and the per-image files
    planned, from Snakemake's own plan:
    a dry run of the workflow (``snakemake -n --quiet``, the same config arguments)
    that writes the plan it counted (`on_snakemake.estimate.PLAN_FILE_ENV`), so that
    progress says what the dry run's estimate says and Snakemake will run.

    Raises
    ------
    ConfigError
        If the dry run fails (its last lines in the message).
    """
    import json
    import os
    import subprocess
    import tempfile

    from .on_snakemake.estimate import PLAN_FILE_ENV

    cmd = [sys.executable, "-m", "snakemake", "-n", "--quiet", "--cores", "1"]
    cmd += ["-s", str(args.workflow_dir / "Snakefile")]
    if args.configfile:
        cmd += ["--configfile", *args.configfile]
    if args.config:
        cmd += ["--config", *args.config]
    if args.replace_workflow_config:
        cmd.append("--replace-workflow-config")
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.json"
        result = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env={**os.environ, PLAN_FILE_ENV: str(plan)},
            check=False,
        )
        if result.returncode or not plan.is_file():
            tail = " | ".join(result.stderr.strip().splitlines()[-3:])
            raise ConfigError(f"the dry run that counts the plan failed: {tail}")
        data = json.loads(plan.read_text())
    done, ceiling = (
        {(enc, area): (n, total) for enc, area, n, total in data[kind]}
        for kind in ("per_image", "ceiling")
    )
    return done, ceiling, set(data["planned"])


def cmd_progress(scenario: Scenario, args) -> int:
    """
    Print done / total per configuration and for the noise ceiling: here, what
    Snakemake's plan does not compute (`planned_progress`); on the Modal volume with
    --modal-volume, the files there. Exit status 0 when nothing is left.
    """
    ceiling = {}
    if args.modal_volume:
        prefix = args.modal_volume_prefix or default_prefix()
        done = volume_progress(scenario, args.modal_volume, prefix)
        print(f"on Modal volume {args.modal_volume!r}, folder {prefix!r}:")
        print(
            "(finished there and not home yet; the next run with the same settings "
            "reuses them)"
        )
    else:
        done, ceiling, planned = planned_progress(args)
        # Files Snakemake will not recompute but that are bad (written after the
        # last check before Stage 5): that check sets them aside, the next run
        # recomputes them. Not done.
        bad = [(f, p) for f, p in bad_per_image_files(scenario) if f not in planned]
        for f, _ in bad:
            counts = ceiling if is_ceiling_file(f) else done
            enc, area, _ = parse_image_file(f)
            key = (enc, area)
            n, total = counts[key]
            counts[key] = (n - 1, total)
        if bad:
            print(
                f"{len(bad)} per-image file(s) are bad and not counted: the run's "
                "check before Stage 5 sets them aside, the run after recomputes them "
                "(`multigeom-workflow verify --set-aside`: the next run does)",
                file=sys.stderr,
            )
    for (enc, area), (n, total) in done.items():
        print(f"{enc + '/' + area:<24} {n:>6} / {total}")
    if scenario.ceiling_images and ceiling:
        n, total = (sum(counts) for counts in zip(*ceiling.values(), strict=True))
        print(f"{CEILING_ROW:<24} {n:>6} / {total}")
        done = {**done, ("", "ceiling"): (n, total)}
    n_done = sum(n for n, _ in done.values())
    n_total = sum(t for _, t in done.values())
    print(f"{'all':<24} {n_done:>6} / {n_total}")
    return 0 if n_done == n_total else 3


def cmd_verify(scenario: Scenario, args) -> int:
    """
    List the run's per-image files that exist but are bad
    (`multigeom_workflow.results.verify`), one line each with its problem; with
    --set-aside rename them to ``<name>.bad`` so that the next run recomputes them. Exit
    status 0 when none is bad, 1 otherwise.
    """
    bad = bad_per_image_files(scenario)
    held = locked()
    if bad and args.set_aside and held:
        print(
            f"verify: a Snakemake run holds the lock on this directory ({held[0]}); "
            "wait for it to end, then run verify --set-aside again",
            file=sys.stderr,
        )
        return 1
    n_checked = sum(os.path.exists(f) for f, *_ in run_files(scenario))
    for f, problem in bad:
        print(f"{f}: {problem}")
    if not bad:
        tail = ""
    elif args.set_aside:
        set_aside(f for f, _ in bad)
        tail = ": set aside as <name>.bad; the next run recomputes them"
    else:
        tail = ": `multigeom-workflow verify --set-aside` sets them aside to recompute"
    print(
        f"{len(bad)} bad of {n_checked} per-image file(s) (noise ceiling's included)"
        f"{tail}",
        file=sys.stderr,
    )
    return 1 if bad else 0


def cmd_clear(scenario: Scenario, args) -> int:
    """
    Delete (or list, with --list) the per-image files of the chosen configurations'
    first images: their first estimates and the noise ceiling's second ones.
    """
    configs = _selected(scenario, args.configs)
    n = scenario.n_images if args.n_images is None else args.n_images
    files = [
        Path(path(c.encoder, c.area, i))
        for path, count in (
            (scenario.per_image_file, n),
            (scenario.ceiling_file, min(n, scenario.ceiling_images)),
        )
        for c in configs
        for i in range(count)
    ]
    all_files, files = files, [f for f in files if f.exists()]
    if not args.list:
        held = locked()
        if held:
            print(
                f"clear: a Snakemake run holds the lock on this directory "
                f"({held[0]}); wait for it to end (or, if it crashed, run "
                "`snakemake --unlock`), then clear again",
                file=sys.stderr,
            )
            return 1
    for f in files:
        print(f)
        if not args.list:
            f.unlink()
    if not args.list:  # nor put back by the next run (compute/kept.py)
        for f in all_files:
            drop_kept(f)
    verb = "would delete" if args.list else "deleted"
    print(f"{verb} {len(files)} per-image file(s)", file=sys.stderr)
    if args.modal_volume:
        prefix = args.modal_volume_prefix or default_prefix()
        chosen = [str(f) for f in all_files]
        if args.list:
            on_volume = volume_files(args.modal_volume, prefix, "")
            remote = [f for f in chosen if f in on_volume]
        else:
            remote = volume_remove(chosen, args.modal_volume, prefix)
        for f in remote:
            print(f"{args.modal_volume}:{prefix}/{f}")
        print(
            f"{verb} {len(remote)} per-image file(s) on Modal volume "
            f"{args.modal_volume!r}",
            file=sys.stderr,
        )
    return 0


def main(argv=None) -> int:
    """Entry point of ``multigeom-workflow``."""
    # the module's docstring as written: its commands one per line
    parser = argparse.ArgumentParser(
        prog="multigeom-workflow",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--configfile", nargs="+", default=[], help="config YAML file(s)"
    )
    common.add_argument("--config", nargs="+", default=[], metavar="KEY=VALUE")
    common.add_argument(
        "--replace-workflow-config",
        action="store_true",
        help="as Snakemake's: the command line's config replaces config/config.yaml",
    )
    common.add_argument(
        "--workflow-dir",
        type=Path,
        default=CHECKOUT_DIR,
        help="the folder of the workflow's Snakefile (default: this checkout)",
    )
    common.add_argument(
        "--modal-volume",
        metavar="NAME",
        help="also the per-image files on this Modal Volume (the profile's "
        "modal-volume)",
    )
    common.add_argument(
        "--modal-volume-prefix",
        metavar="FOLDER",
        help="the run's folder on the volume (default: this directory's name and "
        "a hash of its path, as the Modal plugin names it)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "progress",
        parents=[common],
        help="per-image files done / total per configuration",
    )
    clear = sub.add_parser(
        "clear",
        parents=[common],
        help="delete per-image files of chosen configurations and first images",
    )
    clear.add_argument(
        "--configs", nargs="+", metavar="ENCODER/AREA", help="default: all of the run"
    )
    clear.add_argument(
        "--n-images", type=int, help="the first N images (default: n_images)"
    )
    clear.add_argument("--list", action="store_true", help="list, delete nothing")
    verify = sub.add_parser(
        "verify",
        parents=[common],
        help="list the per-image files that are bad (damaged, other settings)",
    )
    verify.add_argument(
        "--set-aside",
        action="store_true",
        help="rename bad files to <name>.bad so that the next run recomputes them",
    )
    install = sub.add_parser(
        "install-profiles",
        help="register the workflow's profiles (snakemake --profile local-gpu)",
    )
    install.add_argument(
        "--workflow-dir", type=Path, default=common.get_default("workflow_dir")
    )
    modal_check.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        if args.command == "modal-check":
            return modal_check.main(args)
        if args.command == "install-profiles":
            for link in install_profiles(args.workflow_dir / "profiles"):
                print(f"{link} -> {link.resolve()}")
            return 0
        config = load_config(
            args.configfile,
            args.config,
            args.workflow_dir,
            args.replace_workflow_config,
        )
        scenario = validated_scenario(config, args.workflow_dir)
        command = {
            "progress": cmd_progress,
            "clear": cmd_clear,
            "verify": cmd_verify,
        }[args.command]
        return command(scenario, args)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        if not args.__dict__.get("modal_volume"):
            raise
        # Modal's client: no token, no network, ...
        print(
            f"modal volume {args.modal_volume!r}: {type(err).__name__}: {err}",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
