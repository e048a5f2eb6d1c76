"""The pipeline's Spark session settings (``pipeline/jobs.py``), without a JVM."""

from __future__ import annotations

from martinet.pipeline.jobs import local_settings


def test_the_scratch_folder_takes_spark_local_files_and_the_jvms_temporary_ones(tmp_path):
    settings = local_settings({"spark.sql.shuffle.partitions": "4"}, tmp_path, {})
    temporary = f"-Djava.io.tmpdir={tmp_path.resolve()}"
    assert settings["spark.local.dir"] == str(tmp_path.resolve())
    assert settings["spark.driver.extraJavaOptions"] == settings["spark.executor.extraJavaOptions"] == temporary
    assert settings["spark.sql.shuffle.partitions"] == "4"
    assert settings["spark.ui.enabled"] == "false"


def test_an_operators_jvm_options_follow_the_scratch_folders_and_other_settings_replace():
    conf = {
        "spark.executor.extraJavaOptions": "-XX:+UseG1GC",
        "spark.executor.memory": "2g",
        "spark.ui.enabled": "true",
    }
    settings = local_settings({}, None, conf)  # no scratch folder: nothing to keep
    assert settings["spark.executor.extraJavaOptions"] == "-XX:+UseG1GC"
    assert "spark.driver.extraJavaOptions" not in settings
    assert settings["spark.executor.memory"] == "2g"
    assert settings["spark.ui.enabled"] == "true"


def test_with_a_scratch_folder_the_operators_jvm_options_are_added_to_its_own(tmp_path):
    conf = {"spark.executor.extraJavaOptions": "-XX:+UseG1GC -Dx=1", "spark.executor.memory": "2g"}
    settings = local_settings({}, tmp_path, conf)
    temporary = f"-Djava.io.tmpdir={tmp_path.resolve()}"
    assert settings["spark.executor.extraJavaOptions"] == f"{temporary} -XX:+UseG1GC -Dx=1"
    assert settings["spark.driver.extraJavaOptions"] == temporary
    assert settings["spark.executor.memory"] == "2g"
