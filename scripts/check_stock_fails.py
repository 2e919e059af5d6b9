"""Read the junit XML of a run of the `claims_fix` tests on the pristine base; exit 1 unless every
test failed at an assertion. Prints one line per test: its outcome and the first line of the failure."""

import sys
import xml.etree.ElementTree as ET

ASSERTION_FAILURES = ("AssertionError", "Failed")


def main(path: str) -> int:
    cases = ET.parse(path).getroot().iter("testcase")
    bad = 0
    total = 0
    for case in cases:
        total += 1
        name = f"{case.get('classname')}::{case.get('name')}"
        failure = case.find("failure")
        if failure is not None:
            message = (failure.get("message") or "").splitlines()[0][:150]
            at_assertion = message.startswith(ASSERTION_FAILURES) or "assert" in message
            bad += not at_assertion
            print(f"{'FAILS ' if at_assertion else 'FAILS (not at an assertion)'} {name}: {message}")
        else:
            outcome = "ERROR" if case.find("error") is not None else "SKIPPED" if case.find("skipped") is not None else "PASSES"
            bad += 1
            print(f"{outcome} on stock (must fail): {name}")
    print(f"stock-fails: {total - bad} of {total} fix tests fail on the pristine base at an assertion")
    return 1 if bad or not total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
