"""Rule export_demo_photos: the demo's test photographs, as PNG files in test order."""

from multigeom_workflow.demo import export_photo
from multigeom_workflow.jobs import job_log
from multigeom_workflow.test_images import DEMO_TEST_PHOTOS, package_photo

with job_log(snakemake.log[0]):
    for (package, name), out in zip(DEMO_TEST_PHOTOS, snakemake.output, strict=True):
        export_photo(package_photo(package, name), out)
        print(f"{package}/data/{name} -> {out}")
