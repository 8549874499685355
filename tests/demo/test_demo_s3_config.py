"""The demo's S3 mode variables (format documented in ``recoverydash/demo/__main__.py``)."""

from __future__ import annotations

import pytest

from recoverydash.demo.__main__ import S3Mode


def test_unset_means_the_local_folder():
    assert S3Mode.from_env({}) is None
    assert S3Mode.from_env({"RECOVERYDASH_DEMO_S3": "  "}) is None


def test_bucket_prefix_endpoint_region_and_keys():
    m = S3Mode.from_env({"RECOVERYDASH_DEMO_S3": "s3://my-bucket/some/prefix/",
                         "RECOVERYDASH_DEMO_S3_ENDPOINT": "http://127.0.0.1:9000",
                         "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t",
                         "AWS_DEFAULT_REGION": "eu-west-1"})
    assert (m.url, m.bucket, m.prefix) == ("s3://my-bucket/some/prefix", "my-bucket",
                                           "some/prefix")
    assert m.location("demo-a") == "s3://my-bucket/some/prefix/demo-a"
    assert m.run_prefix("demo-a") == "some/prefix/demo-a/"
    assert m.client_args() == {"endpoint_url": "http://127.0.0.1:9000", "region": "eu-west-1",
                               "access_key_id": "AKIDEXAMPLE", "secret_access_key": "s3cr3t"}
    assert m.server_env() == {"AWS_DEFAULT_REGION": "eu-west-1",
                              "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
                              "AWS_SECRET_ACCESS_KEY": "s3cr3t",
                              "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000"}
    assert "s3cr3t" not in m.describe()


def test_defaults_no_prefix_aws_endpoint_and_the_default_chain():
    m = S3Mode.from_env({"RECOVERYDASH_DEMO_S3": "s3://bucket-only"})
    assert (m.url, m.prefix, m.endpoint, m.region) == ("s3://bucket-only", "", "", "us-east-1")
    assert m.location("demo-a") == "s3://bucket-only/demo-a"
    assert m.run_prefix("demo-a") == "demo-a/"
    assert m.client_args()["endpoint_url"] is None and m.client_args()["access_key_id"] is None
    assert m.server_env() == {"AWS_DEFAULT_REGION": "us-east-1"}
    assert "default chain" in m.describe()
    fallback = S3Mode.from_env({"RECOVERYDASH_DEMO_S3": "s3://b-1/p",
                                "AWS_ENDPOINT_URL_S3": "https://minio.local"})
    assert fallback.endpoint == "https://minio.local"


@pytest.mark.parametrize("env", [{"RECOVERYDASH_DEMO_S3": "my-bucket"},
                                 {"RECOVERYDASH_DEMO_S3": "s3:///prefix"},
                                 {"RECOVERYDASH_DEMO_S3": "s3://b/p",
                                  "RECOVERYDASH_DEMO_S3_ENDPOINT": "localhost:9000"}])
def test_malformed_values_are_refused(env):
    with pytest.raises(ValueError):
        S3Mode.from_env(env)
