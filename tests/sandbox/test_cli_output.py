"""What the sandbox reads from the real CLI's output: the error of each failed resource, in one line that names it,
and the update's counts. The texts are the CLI's own (v3.259.0), as it printed them in the sandbox's flows."""

from __future__ import annotations

from kimi_cluster.sandbox.cli_stacks import _counts, failures

COMMAND_FAILED = '''Updating (sandbox):
 +  command:remote:Command kimi-node0-ready creating (6s) error: Process exited with status 124: running "\\"x\\"":
 +  pulumi:pulumi:Stack kimi-cluster-sandbox **creating failed** 1 error; 1 warning
Diagnostics:
  pulumi:pulumi:Stack (kimi-cluster-sandbox):
    warning: image 'vllm/vllm-openai:kimi-k31' is a tag without a digest
    error: update failed

  command:remote:Command (kimi-node0-ready):
    error: Process exited with status 124: running "# step ready\\nprintf %s 'IyEv' | base64 -d \\"$x\\"":
    kimi-cluster step ready ran out of its 6 s deadline on the node and was stopped

Resources:
    + 12 created
    1 errored

Duration: 9s
'''

PROVIDER_RAISED = '''Diagnostics:
  pulumi:pulumi:Stack (kimi-cluster-verification-sandbox):
    error: update failed

    Traceback (most recent call last):
      File "/x/pulumi-language-python-exec", line 232, in <module>
    KeyboardInterrupt

  pulumi-python:dynamic/kimi-verification:EndpointVerification (endpoint):
    error: Traceback (most recent call last):
      File "/x/pulumi/dynamic/__main__.py", line 84, in wrapper
        return fn(self, request, context)
               ^^^^^^^^^^^^^^^^^^^^^^^^^^
    kimi_cluster.checks.results.VerificationFailed: verification of https://10.213.1.2 failed; models: HTTP 502

Resources:
    + 1 created
    2 errored
'''


def test_a_failed_command_is_named_with_its_exit_and_its_words_not_the_command_it_ran() -> None:
    assert failures(COMMAND_FAILED) == [
        "command:remote:Command 'kimi-node0-ready': Process exited with status 124; kimi-cluster step ready ran out "
        "of its 6 s deadline on the node and was stopped"]
    assert _counts(COMMAND_FAILED) == {"create": 12}


def test_a_provider_traceback_is_its_exception_message_and_the_stack_line_is_left_out() -> None:
    assert failures(PROVIDER_RAISED) == [
        "pulumi-python:dynamic/kimi-verification:EndpointVerification 'endpoint': verification of "
        "https://10.213.1.2 failed; models: HTTP 502"]


def test_the_stacks_own_error_stands_when_no_resource_says_more() -> None:
    text = "Diagnostics:\n  pulumi:pulumi:Stack (kimi-cluster-sandbox):\n    error: kimi-cluster:image is required\n"
    assert failures(text) == ["kimi-cluster:image is required"]
    assert failures("error: no Pulumi.yaml project file found\n") == ["no Pulumi.yaml project file found"]
