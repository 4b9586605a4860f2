import Foundation
import Testing
@testable import Replica

@Suite("Adversarial: history tokens")
struct AdversarialHistoryTests {
    /// A token from the future of a store — saved by the app before the store file was restored from an older backup —
    /// must not push the expiry watermark past the history that exists.
    @Test("pruning through a token newer than the store's history never expires the transactions that follow")
    func pruneThroughAFutureToken() throws {
        let directory = TestDirectory()
        let container = try ModelContainer(for: Ledger.self, environment: directory.environment())
        let context = ModelContext(container)
        context.insert(Ledger(memo: "one"))
        try context.save()
        let current = try context.currentHistoryToken(of: "default")
        let fromTheFuture = HistoryToken(storeIdentity: current.storeIdentity, value: current.value + 1_000)
        #expect(try context.deleteHistory(through: fromTheFuture) == 1)

        let before = try context.currentHistoryToken(of: "default")
        context.insert(Ledger(memo: "two"))
        try context.save()
        let after = try context.fetchHistory(HistoryDescriptor(after: before))
        #expect(after.count == 1)
        #expect(after.first?.changes.count == 1)
    }
}
