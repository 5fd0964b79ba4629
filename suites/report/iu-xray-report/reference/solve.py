"""Reference solution for iu-xray-report: classical chest X-ray reading, templated report.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}.txt' [--cases ID ...]

The reading and the report are cxr_report.py's (its docstring says what is measured and
how each finding is worded); this task picks IU X-ray's report style.
"""

from cxr_report import main

if __name__ == "__main__":
    main("iu")
