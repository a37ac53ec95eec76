"""Add up pytest JUnit reports into one closing line: 'total: N passed, N failed, N skipped'."""

import sys
import xml.etree.ElementTree as ET


def main(paths):
    passed = failed = skipped = 0
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError):
            failed += 1  # a run that died before writing its report
            print(f"{path}: no report", file=sys.stderr)
            continue
        suites = list(root.iter("testsuite"))
        if not suites:
            failed += 1  # the run was killed (timeout) before pytest wrote its report
            print(f"{path}: no report", file=sys.stderr)
        for suite in suites:
            tests, skips = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
            bad = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            passed += tests - skips - bad
            failed += bad
            skipped += skips
    print(f"total: {passed} passed, {failed} failed, {skipped} skipped")


if __name__ == "__main__":
    main(sys.argv[1:])
