"""The Ray and MLflow layer of eae-platform.

It lives in the repository folder `platform/` but is imported as `eae_platform`: `platform`
is a standard-library module, and Ray puts the job's working directory on every worker's
sys.path, where a package of that name would shadow it.
"""
