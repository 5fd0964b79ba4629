// An Allure 3 plugin for scripts/allure-report: AutoMedBench's gates as the report's
// quality-gate results.
//
// The pytest session decides its gates (coverage, --amb-fail-under, --amb-baseline) and
// writes them, in Allure 3's quality-gate result form, to automedbench-allure3.json in
// the results folder; scripts/allure-report passes them to this plugin as its `results`
// option. `allure generate` evaluates no quality gate of its own (Allure 3.18: only
// `allure run` and `allure quality-gate` do), so the plugin adds the session's verdicts
// to the report's store when the report is done, before the awesome plugin (listed after
// it) writes its Quality Gates view. It restores them as a dump of nothing but
// quality-gate results would: the store's one public way in for them.
export default class AutoMedBenchGates {
  constructor(options = {}) {
    this.options = options;
  }

  async done(context, store) {
    const results = Array.isArray(this.options.results) ? this.options.results : [];
    if (results.length === 0) {
      return;
    }
    await store.restoreState({
      testResults: {},
      attachments: {},
      testCases: {},
      fixtures: {},
      checkResults: {},
      reportVariables: {},
      environments: [],
      qualityGateResults: results,
    });
  }
}
