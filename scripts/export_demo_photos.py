"""Rule export_demo_photos: the demo's test photographs, as PNG files in test order."""

from multigeom_workflow.inputs.demo.data import export_photo
from multigeom_workflow.inputs.images import DEMO_TEST_PHOTOS, package_photo
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    for (package, name), out in zip(DEMO_TEST_PHOTOS, snakemake.output, strict=True):
        export_photo(package_photo(package, name), out)
        print(f"{package}/data/{name} -> {out}")
